"""One pre-training run per point of a grid of overrides; downstream batteries and summaries of a sweep.

    bert-jax sweep --help

The flags and the work are launch/sweep.py's (the launcher layer, which the library's sweeps and batteries use too).
"""
from launch import sweep


def main() -> None:
    sweep.main()


if __name__ == "__main__":
    main()
