"""Runs N processes of one command on this machine, joined by jax.distributed.

    bert-jax local --help

The flags and the work are launch/local.py's (the launcher layer, which the library's sweeps and batteries use too).
"""
from launch import local


def main() -> None:
    local.main()


if __name__ == "__main__":
    main()
