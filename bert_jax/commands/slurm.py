"""Writes an sbatch script for multi-node GPU pre-training.

    bert-jax slurm --help

The flags and the work are launch/slurm.py's (the launcher layer, which the library's sweeps and batteries use too).
"""
from launch import slurm


def main() -> None:
    slurm.main()


if __name__ == "__main__":
    main()
