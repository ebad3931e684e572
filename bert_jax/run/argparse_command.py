"""The commands that parse their flags with argparse (the launchers: sub-commands, and flags after `--` handed on to
the command they start), refusing a mistake as bert_jax/run/command_line.py refuses the others'.

argparse answers a bad flag with its whole usage block (many lines for a launcher) and names the program by its
file; here a bad flag, like a `UserError` from below, is `bert-jax <command>: <what>` in at most three lines and
status 2, and `--help` is headed `bert-jax <command>`.
"""
import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from bert_jax import UserError
from bert_jax.run import backend_choice, command_line


class FlagError(UserError):
    """A flag argparse refused: unknown, missing, of the wrong type or not among its choices."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose errors raise FlagError (its sub-commands' parsers too), with `--verbose`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)  # docstrings keep their lines
        super().__init__(*args, **kwargs)
        self.add_argument("--verbose", action="store_true", help=f"on a mistake in the input, print the traceback "
                                                                  f"too (or set {command_line.VERBOSE_ENV}=1)")

    def error(self, message: str) -> NoReturn:
        raise FlagError(message)

    def parse_with_overrides(self, argv: Sequence[str]) -> argparse.Namespace:
        """The command's own flags, and in `.overrides` the arguments after `--` (a launcher hands them to the command
        it starts: `--config.a.b=value` overrides)."""
        argv = list(argv)
        cut = argv.index("--") if "--" in argv else len(argv)
        args = self.parse_args(argv[:cut])
        args.overrides = argv[cut + 1:]
        return args


def parser(command_file: str, **kwargs) -> ArgumentParser:
    """The parser of the command whose module is `command_file` (its `__file__`), named `bert-jax <command>`."""
    return ArgumentParser(prog=command_line.command_name([command_file]), **kwargs)


def run(command_file: str, main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> NoReturn:
    """Exits with main(argv)'s status (None: 0); a UserError (a FlagError among them) is refused in at most three
    lines, status 2. `argv`: the arguments after the command's name (default: this process's)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    backend_choice.cpu_without_a_tpu()
    try:
        status = main(argv)
    except UserError as error:
        command_line.refuse([command_file, *argv], error, with_help=isinstance(error, FlagError))
    sys.exit(status or 0)
