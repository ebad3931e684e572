"""Launchers: the same pretrain command on TPU VMs, SLURM clusters, local processes, and sweeps."""
import argparse


def parse_with_overrides(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The launcher's flags, and in `.overrides` the pretrain flags that follow `--`."""
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.overrides = argv[cut + 1:]
    return args
