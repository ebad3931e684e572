"""Runs a pre-training on spot TPU slices of a Ray cluster, relaunching it after preemptions until done.

    bert-jax ray-tpu --help

The flags and the work are launch/ray_tpu.py's (the launcher layer, which the library's sweeps and batteries use too).
"""
from launch import ray_tpu


def main() -> None:
    ray_tpu.main()


if __name__ == "__main__":
    main()
