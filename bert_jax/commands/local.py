"""Runs N processes of one command on this machine, joined by jax.distributed.

    bert-jax local --num_processes=2 --devices_per_process=4 -- \\
        bert-jax pretrain --config=configs/tiny.py --workdir=/tmp/tiny2
"""
import argparse
import shlex

from bert_jax.launch import local
from bert_jax.run import argparse_command


def parser() -> argparse_command.ArgumentParser:
    p = argparse_command.parser(__file__, description=__doc__, epilog=local.__doc__)
    p.add_argument("--num_processes", type=int, default=2)
    p.add_argument("--devices_per_process", type=int, default=1)
    p.add_argument("--port", type=int, default=0, help="coordinator port; 0 = a free one")
    p.add_argument("--grace_s", type=float, default=60.0, help="after one process fails, wait this long")
    p.add_argument("--dry_run", action="store_true", help="print each process's command and stop")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    return p


def _main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise argparse_command.FlagError("give the command after --, e.g. -- bert-jax pretrain --config=...")
    if args.dry_run:
        env = f"JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count={args.devices_per_process}"
        for cmd in local.process_commands(command, args.num_processes, args.port or 12355):
            print(f"{env} {shlex.join(cmd)} &")
        return 0
    return local.run_local(command, args.num_processes, args.devices_per_process, args.port, args.grace_s)


def main(argv=None) -> None:
    argparse_command.run(__file__, _main, argv)


if __name__ == "__main__":
    main()
