"""Writes an sbatch script for multi-node GPU pre-training.

    bert-jax slurm --nodes=2 --gpus_per_node=8 --config=configs/bert_large.py \\
        --workdir=/shared/runs/bert_large --submit -- --config.mesh.shape='(2,8,1)'

Everything after -- is passed to pretrain: --config.key=value overrides. `--dry_run` prints the script and the
sbatch command without writing or submitting.
"""
import os
import shlex
import subprocess

from bert_jax import UserError
from bert_jax.launch import slurm
from bert_jax.run import argparse_command


def parser() -> argparse_command.ArgumentParser:
    p = argparse_command.parser(__file__, description=__doc__, epilog=slurm.__doc__)
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
    return p


def parse_args(argv: list[str]):
    """The flags, and in `.overrides` the pretrain overrides after `--`."""
    return parser().parse_with_overrides(argv)


def _main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.nodes < 1 or args.gpus_per_node < 1:
        raise UserError(f"--nodes={args.nodes} --gpus_per_node={args.gpus_per_node}: both must be >= 1")
    script = slurm.sbatch_script(args)
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


def main(argv=None) -> None:
    argparse_command.run(__file__, _main, argv)


if __name__ == "__main__":
    main()
