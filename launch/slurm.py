"""An sbatch script for multi-node GPU pre-training, from launch/slurm.sbatch.

    python -m launch.slurm --nodes=2 --gpus_per_node=8 --config=configs/bert_large.py \
        --workdir=/shared/runs/bert_large --submit -- --config.mesh.shape='(2,8,1)'

`srun` starts one task per GPU; `--config.distributed.auto=True` makes every task call
`jax.distributed.initialize()` with no arguments, which JAX fills from SLURM's
environment (coordinator: the first node, port from the job id). With 2 x 8 GPUs the
global device order is node-major, so mesh shape (2, 8, 1) shards parameters (FSDP)
inside a node and replicates them across the two nodes (DP over the slower network).
`--dry_run` prints the script and the sbatch command without writing or submitting.
"""
import argparse
import os
import shlex
import string
import subprocess
import sys

from launch import parse_with_overrides

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm.sbatch")


def sbatch_script(args) -> str:
    command = shlex.join([
        "python", "-m", "bert_jax.commands.pretrain", f"--config={args.config}", f"--workdir={args.workdir}",
        "--config.distributed.auto=True", *args.overrides,
    ])
    with open(TEMPLATE) as f:
        template = string.Template(f.read())
    return template.substitute(
        job_name=args.job_name, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
        num_processes=args.nodes * args.gpus_per_node, cpus_per_task=args.cpus_per_task, time=args.time,
        log_dir=args.log_dir, partition_line=f"#SBATCH --partition={args.partition}" if args.partition else "",
        repo_dir=args.repo_dir, setup=args.setup, command=command,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus_per_node", type=int, default=8)
    p.add_argument("--cpus_per_task", type=int, default=8)
    p.add_argument("--job_name", default="bert_jax")
    p.add_argument("--partition", default="")
    p.add_argument("--time", default="48:00:00")
    p.add_argument("--log_dir", default="slurm_logs")
    p.add_argument("--repo_dir", default=os.getcwd(), help="the checkout on the shared filesystem")
    p.add_argument("--setup", default="source .venv/bin/activate",
                   help="shell line run before srun (environment with jax[cuda12] installed)")
    p.add_argument("--config", default="configs/bert_base.py")
    p.add_argument("--workdir", required=True, help="on a filesystem every node sees")
    p.add_argument("--script", default="", help="where to write the script; default <log_dir>/<job_name>.sbatch")
    p.add_argument("--submit", action="store_true", help="run sbatch on the written script")
    p.add_argument("--dry_run", action="store_true", help="print the script and the sbatch command only")
    p.epilog = "Everything after -- is passed to pretrain: --config.key=value overrides."
    return p


def parse_args(argv: list[str]):
    return parse_with_overrides(parser(), argv)


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.nodes < 1 or args.gpus_per_node < 1:
        sys.exit("launch.slurm: --nodes and --gpus_per_node must be >= 1")
    script = sbatch_script(args)
    path = args.script or os.path.join(args.log_dir, f"{args.job_name}.sbatch")
    submit = ["sbatch", path]
    if args.dry_run:
        print(script)
        print(shlex.join(submit))
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    os.makedirs(args.log_dir, exist_ok=True)
    with open(path, "w") as f:
        f.write(script)
    print(f"wrote {path}")
    if args.submit:
        print(shlex.join(submit), flush=True)
        subprocess.run(submit, check=True)


if __name__ == "__main__":
    main()
