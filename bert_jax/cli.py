"""`bert-jax <command> ...`: one console script for every command; `bert-jax --help` lists them.

    bert-jax pretrain --config=configs/tiny.py --workdir=/tmp/bert_tiny
    bert-jax show-config --config=configs/roberta_base.py --config.data.mask_rate=0.2
    bert-jax export --workdir=/tmp/bert_tiny --out=/tmp/bert_tiny_hf

The commands are the modules of bert_jax/commands/ (`show_config.py` is `show-config`), each described by the
first line of its docstring; the table is read from that folder, without importing any of them, so `bert-jax
--help` costs no JAX start-up. `bert-jax <command> --help` shows that command's flags. Each command runs exactly as
`python -m bert_jax.commands.<module>` does (the module is run as __main__): the same help, flags and exit status.
"""
import ast
import pathlib
import runpy
import sys

COMMANDS_DIR = pathlib.Path(__file__).resolve().parent / "commands"
COMMANDS_PACKAGE = "bert_jax.commands"


def command_modules() -> dict[str, pathlib.Path]:
    """command name -> its module file, in name order: every public module of bert_jax/commands/."""
    return {file.stem.replace("_", "-"): file for file in sorted(COMMANDS_DIR.glob("*.py"))
            if not file.stem.startswith("_")}


def summary(file: pathlib.Path) -> str:
    """The first line of a command module's docstring: what the command does."""
    docstring = ast.get_docstring(ast.parse(file.read_text(), str(file))) or ""
    return docstring.strip().splitlines()[0] if docstring.strip() else ""


# command -> (module run as __main__, what it does)
COMMANDS = {name: (f"{COMMANDS_PACKAGE}.{file.stem}", summary(file)) for name, file in command_modules().items()}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return ("usage: bert-jax <command> [flags]   (bert-jax <command> --help: its flags)\n\ncommands:\n"
            + "\n".join(lines) + "\n")


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help", "help"):
        sys.stdout.write(usage())
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    if sys.argv[1] not in COMMANDS:
        sys.exit(f"bert-jax: unknown command {sys.argv[1]!r}\n\n{usage()}")
    module, _ = COMMANDS[sys.argv.pop(1)]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
