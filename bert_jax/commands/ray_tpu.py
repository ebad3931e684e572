"""Runs a pre-training on spot TPU slices of a Ray cluster, relaunching it after preemptions until done.

    ray up launch/ray_tpu_cluster.yaml          # once: a cluster whose autoscaler recreates lost slices
    bert-jax ray-tpu --address=HEAD_IP:6379 --tpu=v4-32 --config=configs/bert_large.py \\
        --workdir=gs://BUCKET/runs/bert_large -- --config.mesh.shape='(1,-1,1)'

Everything after -- is passed to the command each host runs: --config.key=value overrides. `python -m
launch.ray_tpu ...`, from the repository root, is the same command (the name docs/design.md fixes).
"""
import os

from bert_jax.launch import ray_tpu
from bert_jax.run import argparse_command


def parser() -> argparse_command.ArgumentParser:
    p = argparse_command.parser(__file__, description=__doc__, epilog=ray_tpu.__doc__)
    p.add_argument("--address", required=True, help="the Ray cluster's HEAD_IP:PORT (GCS port, 6379 by default)")
    p.add_argument("--tpu", required=True, help="slice type, e.g. v4-32, v5litepod-16, v5p-64")
    p.add_argument("--config", required=True)
    p.add_argument("--command", choices=ray_tpu.COMMANDS, default=ray_tpu.COMMANDS[0], help="the module each host runs")
    p.add_argument("--workdir", required=True, help="gs:// or s3:// (local only for a one-host slice)")
    p.add_argument("--max_preemptions", type=int, default=20, help="relaunch at most this many times")
    p.add_argument("--max_failures", type=int, default=0,
                   help="crashes retried (only when the run got further than at the previous one)")
    p.add_argument("--max_wait", type=float, default=3600.0, help="seconds to wait for a free slice")
    p.add_argument("--num_hosts", type=int, default=0, help="hosts per slice; 0: from --tpu")
    p.add_argument("--python", default="python3", help="the interpreter on the hosts")
    p.add_argument("--repo", default=os.getcwd(), help="the project's directory on the hosts (default: this one)")
    return p


def _main(argv: list[str]) -> int:
    return ray_tpu.launch(parser().parse_with_overrides(argv))


def main(argv=None) -> None:
    argparse_command.run(__file__, _main, argv)


if __name__ == "__main__":
    main()
