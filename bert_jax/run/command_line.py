"""How every command starts and how it refuses: its help, and a user's mistake as at most three lines and status 2.

A user's mistake (docs/design.md, "Fail loudly, early, clearly") is a `bert_jax.UserError` raised anywhere below a
command (the path layer's StorageError, a changed experiment or data, a held lease and an incompatible checkpoint are
ones too), a flag absl refuses (unknown, missing, of the wrong type), a config file that does not load or an override
whose key or value does not parse. `run` turns each into `bert-jax <command>: <what, the value, what is accepted>` on
stderr and exit status 2, without the traceback: that names our code, not the user's input. `--verbose` (every
command has it) or BERT_JAX_VERBOSE=1 prints the traceback too. A store that fails under a running command (a full
disk, a checkpoints folder or bucket refusing writes: `bert_jax.StorageFault`, or such an OSError) is no bug either:
its message, at most three lines, and status 1. Anything else is a bug, and keeps its traceback.

ml_collections reports a mistyped override key from deep inside flag parsing: a long traceback that ends, usefully,
in "Did you mean"; here it is the one line naming the flag. An exception the config file's own code raises (an unknown
variant, `--config=configs/tiny.py:nosuch`) it wraps in "Error whilst parsing config file" and a traceback; here it is
the file's own message, in one line.

absl prints `--help` to stdout but exits 1, heads the flags with the command's install path and leaves the rest to
the module docstring; here `--help` exits 0 and the flags are listed under "flags:".
"""
import errno
import os
import pathlib
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from absl import app, flags

from bert_jax import StorageFault, UserError
from bert_jax.run import backend_choice
from bert_jax.run import mixture_overrides

# The --config flag's help: where its keys are listed.
CONFIG_HELP = ("ml_collections config file (configs/*.py); `bert-jax show-config --config=FILE` prints its keys, each "
               "overridable here as --config.a.b=value")
USER_ERROR_STATUS = 2  # what argparse and absl's flag errors exit with: the command was called wrongly
# A store that failed under a running command (bert_jax.StorageFault, or an OSError of these kinds, e.g. a metrics row
# on a full disk): its one-line message and status 1, no traceback; the same command resumes once it is fixed.
STORAGE_FAULT_STATUS = 1
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
MAX_LINES = 3
VERBOSE_ENV = "BERT_JAX_VERBOSE"
HELP_FLAGS = ("help", "helpshort", "?")
HELPFULL_FLAG = "helpfull"

_VERBOSE = flags.DEFINE_bool("verbose", False, f"On a mistake in the input, print the traceback under the message "
                             f"(or set {VERBOSE_ENV}=1).")

# KeyError / AttributeError from ConfigDict: "'mask_rat'\nDid you mean "mask_rate" instead of "mask_rat"?"
_SUGGESTION = re.compile(r'Did you mean "([^"]+)" instead of "([^"]+)"')
_KEY = re.compile(r"""['"\\]*([A-Za-z_][\w]*)['"\\]*""")
# How ml_collections wraps an exception the config file's get_config raised, traceback and all.
PARSE_ERROR = "Error whilst parsing config file"


def run(main: Callable[[Sequence[str]], None], known_only: bool = False) -> None:
    """absl's app.run(main) with the help and the refusals above. `known_only`: flags this program does not define
    are left in argv for main (prepare-beam hands them to Beam)."""
    backend_choice.cpu_without_a_tpu()
    app.run(lambda argv: _call(main, argv), flags_parser=lambda argv: parse_flags(argv, known_only))


def _call(main: Callable[[Sequence[str]], None], argv: Sequence[str]) -> None:
    try:
        return main(argv)
    except (UserError, app.UsageError, flags.Error) as error:
        refuse(argv, error, with_help=not isinstance(error, UserError))
    except (StorageFault, OSError) as error:
        if not isinstance(error, StorageFault) and error.errno not in STORAGE_ERRNOS:
            raise
        refuse(argv, error, status=STORAGE_FAULT_STATUS)


def parse_flags(argv: Sequence[str], known_only: bool = False) -> list[str]:
    """absl's flag parsing, answering --help itself, and refusing a bad flag, config file or override in one line."""
    asked = _help_asked(argv)
    if asked:
        print_help(argv, full=asked == HELPFULL_FLAG)
        sys.exit(0)
    try:
        argv, mixture = mixture_overrides.take(argv)  # keys the config file may not hold (run/mixture_overrides.py)
        if mixture:
            sys.argv = list(argv)  # ml_collections reads the overrides from sys.argv itself
        rest = flags.FLAGS(argv, known_only=known_only)
        if "config" in flags.FLAGS and flags.FLAGS["config"].present:  # a file that did not load fails when read
            getattr(flags.FLAGS["config"].value, "keys")
            mixture_overrides.apply(flags.FLAGS["config"].value, mixture)
        elif mixture:
            raise UserError(f"{mixture[0].flag}: this command takes no --config")
        return rest
    except UserError as error:
        refuse(argv, error)
    except flags.IllegalFlagValueError as error:  # an override's value, a missing flag: absl's message is one line
        refuse(argv, UserError(config_file_error(error)) if PARSE_ERROR in str(error) else error)
    except flags.Error as error:  # an unknown flag
        refuse(argv, error, with_help=True)
    except (AttributeError, KeyError) as error:
        message = config_key_error(argv, error)
        if message is None:
            raise  # not an override's key: an error inside the config file's own code, whose traceback says where
        refuse(argv, UserError(message))
    except (OSError, ValueError, TypeError, SyntaxError) as error:  # a config file that does not load
        cause = [line.strip() for line in str(error).splitlines() if line.strip()][-1:]  # the root cause is last
        given = next((a for a in argv[1:] if a.startswith("--config=")), "--config")
        refuse(argv, UserError(f"{given}: {' '.join(cause)}"))


def config_file_error(error: BaseException) -> str:
    """The one line a config file's own code raised (a variant it does not know, say), out of the traceback
    ml_collections wraps it in: `--config=configs/tiny.py:nosuch: the only variant is 'two_stage'`. A ValueError's
    or UserError's message stands alone; another exception keeps its type (a NameError in the file)."""
    text = str(error)
    given = text.split(":", 1)[0].removeprefix("flag ").strip()  # "flag --config=FILE[:ARG]: Error whilst ..."
    last = [line.strip() for line in text.splitlines() if line.strip()][-1]
    kind, _, message = last.partition(": ")
    if not message or not re.fullmatch(r"[\w.]+", kind):  # not "Type: message": the line as it is
        kind, message = "", last
    if kind.rsplit(".", 1)[-1] in ("ValueError", "UserError"):
        kind = ""
    message = f"{kind}: {message}" if kind else message
    return message if message.startswith(given) else f"{given}: {message}"


def config_key_error(argv: Sequence[str], error: BaseException) -> str | None:
    """`--config.data.mask_rat=0.3: config.data has no key "mask_rat"; did you mean "mask_rate"?`, or None when
    no override names the missing key."""
    text = str(error).encode().decode("unicode_escape")
    suggestion = _SUGGESTION.search(text)
    bad = suggestion.group(2) if suggestion else (_KEY.match(text).group(1) if _KEY.match(text) else "")
    override = next((a for a in argv[1:] if a.startswith("--config.") and bad in a.split("=")[0].split(".")), "")
    if not override:
        return None
    path = override.split("=")[0].lstrip("-").split(".")
    line = f"{override}: {'.'.join(path[:path.index(bad)])} has no key {bad!r}"
    return line + (f"; did you mean {suggestion.group(1)!r}?" if suggestion else "")


def command_name(argv: Sequence[str]) -> str:
    """`bert-jax pretrain` for bert_jax/commands/pretrain.py (the program's name, never a user's install path)."""
    return f"bert-jax {pathlib.PurePath(argv[0]).stem.replace('_', '-')}"


def refuse(argv: Sequence[str], error: BaseException, with_help: bool = False,
           status: int = USER_ERROR_STATUS) -> NoReturn:
    """Ends the command with `status` (2: a mistake) and at most MAX_LINES lines naming the mistake or the fault (the
    traceback above them under --verbose)."""
    if _verbose(argv):
        traceback.print_exception(error)
    lines = [line for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    if len(lines) > MAX_LINES:
        lines = lines[:MAX_LINES - 1] + [f"... and {len(lines) - MAX_LINES + 1} more lines (--verbose shows them)"]
    name = command_name(argv)
    lines[0] = f"{name}: {lines[0]}"
    if with_help and len(lines) < MAX_LINES:
        lines.append(f"`{name} --help` lists its flags")
    sys.stderr.write("\n".join(lines) + "\n")
    sys.exit(status)


def _verbose(argv: Sequence[str]) -> bool:
    if os.environ.get(VERBOSE_ENV, "") not in ("", "0"):
        return True
    if flags.FLAGS.is_parsed():
        return flags.FLAGS["verbose"].value
    return any(arg in ("--verbose", "-verbose", "--verbose=true", "--verbose=1") for arg in _flag_args(argv))


def _flag_args(argv: Sequence[str]) -> list[str]:
    """The arguments before a `--` (after it, they are the program's, not flags)."""
    args = list(argv[1:])
    return args[:args.index("--")] if "--" in args else args


def _help_asked(argv: Sequence[str]) -> str:
    for arg in _flag_args(argv):
        name = arg.lstrip("-").split("=")[0]
        if arg.startswith("-") and name in (*HELP_FLAGS, HELPFULL_FLAG) and arg.partition("=")[2] in ("", "true", "1"):
            return name
    return ""


def print_help(argv: Sequence[str], full: bool = False) -> None:
    """The command's docstring as written, then its flags (all flags of every loaded module with --helpfull)."""
    main_module = argv[0]  # absl files the flags a `__main__` module defines under sys.argv[0]
    name = command_name(argv)
    flag_values = flags.FLAGS
    flag_values.register_key_flag_for_module(main_module, flag_values["verbose"])
    text = flag_values.get_help() if full else flag_values.module_help(main_module)
    text = text.replace(f"\n{main_module}:\n", f"\n{name}:\n")
    if not full:  # one module: its heading says nothing the docstring did not
        text = "\n".join(line[2:] if line.startswith("  ") else line for line in text.splitlines()[2:])
    doc = (sys.modules["__main__"].__doc__ or f"{name} [flags]").strip("\n")
    sys.stdout.write(f"{doc}\n\nflags:\n{text.rstrip()}\n")
    if not full:
        sys.stdout.write(f"\n`{name} --helpfull` lists the flags of every library it loads too.\n")
