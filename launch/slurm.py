"""An sbatch script for multi-node GPU pre-training (`bert-jax slurm`), from launch/slurm.sbatch.

`srun` starts one task per GPU; `--config.distributed.auto=True` makes every task call
`jax.distributed.initialize()` with no arguments, which JAX fills from SLURM's
environment (coordinator: the first node, port from the job id). With 2 x 8 GPUs the
global device order is node-major, so mesh shape (2, 8, 1) shards parameters (FSDP)
inside a node and replicates them across the two nodes (DP over the slower network).
"""
import os
import runpy
import shlex
import string

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


if __name__ == "__main__":  # `python -m launch.slurm` from the repository root: the `bert-jax slurm` command
    runpy.run_module("bert_jax.commands.slurm", run_name="__main__", alter_sys=True)
