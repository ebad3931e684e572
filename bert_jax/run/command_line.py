"""Running a command whose config comes from `--config=FILE` and `--config.a.b=value` overrides.

ml_collections reports a mistyped override key from deep inside flag parsing: a long traceback
that ends, usefully, in "Did you mean". A command run through `run` says the same in one line,
naming the flag, and exits non-zero, before anything is built. So do a config file that does not
load and an override whose value does not parse.
"""
import pathlib
import re
import sys
from collections.abc import Callable, Sequence

from absl import app, flags

# The --config flag's help: where its keys are listed.
CONFIG_HELP = ("ml_collections config file (configs/*.py); `bert-jax show-config --config=FILE` prints its keys, each "
               "overridable here as --config.a.b=value")
# KeyError / AttributeError from ConfigDict: "'mask_rat'\nDid you mean "mask_rate" instead of "mask_rat"?"
_SUGGESTION = re.compile(r'Did you mean "([^"]+)" instead of "([^"]+)"')
_KEY = re.compile(r"""['"\\]*([A-Za-z_][\w]*)['"\\]*""")


def run(main: Callable[[Sequence[str]], None]) -> None:
    """absl's app.run(main), with config-file and override errors as one line."""
    app.run(main, flags_parser=parse_flags)


def parse_flags(argv: Sequence[str]) -> list[str]:
    try:
        rest = flags.FLAGS(argv)
        if "config" in flags.FLAGS:  # a config file that did not load fails only when read
            getattr(flags.FLAGS["config"].value, "keys")
        return rest
    except flags.IllegalFlagValueError as error:  # an override's value: absl's message is one line already
        _exit(argv, str(error))
    except flags.Error:
        raise  # absl prints its own short message (an unknown flag, a missing required one)
    except (AttributeError, KeyError) as error:
        message = config_key_error(argv, error)
        if message is None:
            raise  # not an override's key: an error inside the config file's own code, whose traceback says where
        _exit(argv, message)
    except (OSError, ValueError, TypeError, SyntaxError) as error:  # a config file that does not load
        cause = [line.strip() for line in str(error).splitlines() if line.strip()][-1:]  # the root cause is last
        given = next((a for a in argv[1:] if a.startswith("--config=")), "--config")
        _exit(argv, f"{given}: {' '.join(cause)}")


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


def _exit(argv: Sequence[str], message: str) -> None:
    sys.exit(f"{pathlib.PurePath(argv[0]).name}: {message}")  # the program's name, never a user path
