"""Which ValueError is a refusal of the user's input, and which is a fault of the code.

A command ends a user's mistake with one line and exit status 2 (`bert_jax.UserError`, docs/design.md "Fail loudly,
early, clearly"); an internal error keeps its traceback. Many of the project's checks still refuse with a plain
ValueError naming the key (`config.model.num_heads=12 does not divide ...`), so a command that starts with them
cannot simply let every ValueError through as a fault, nor turn every ValueError into the user's mistake: an unpacking
gone wrong in our code, or numpy's or jax's complaint from deep inside a check, would then read as a typo in the
user's config, its traceback lost.

The line between them is who raised it. A refusal is raised on purpose: by a `raise` statement in this project's
code (bert_jax, data_pipelines, the configs, the launchers). A ValueError the interpreter raised in our code (a bad
unpacking, `int("x")`) or one raised inside a library is a fault. A `UserError` is a refusal wherever it comes from.
"""
import dis
from types import TracebackType
from typing import NoReturn

from bert_jax import UserError

_PROJECT = ("bert_jax", "data_pipelines", "configs", "launch")


def raised_on_purpose(error: BaseException) -> bool:
    """Whether the innermost frame of `error`'s traceback is a `raise` statement of a project module (a check's
    refusal, or a command's own one-line fault such as a compiler that is not installed)."""
    tb: TracebackType | None = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    module = tb.tb_frame.f_globals.get("__name__", "")
    if module.split(".", 1)[0] not in _PROJECT:
        return False
    code = tb.tb_frame.f_code.co_code
    return 0 <= tb.tb_lasti < len(code) and dis.opname[code[tb.tb_lasti]] == "RAISE_VARARGS"


def refusal(error: BaseException) -> UserError | None:
    """`error` as the UserError it is when it refuses the user's input (a UserError, or a ValueError or
    FileNotFoundError a check of ours raised on purpose), its message kept; None for a fault, which the caller
    re-raises as it is."""
    if isinstance(error, UserError):
        return error
    if isinstance(error, (ValueError, FileNotFoundError)) and raised_on_purpose(error):
        return UserError(str(error))
    return None


def reraise(error: BaseException) -> NoReturn:
    """Raises `error` as the user's one-line refusal when it is one (`refusal`), else as it is, its traceback kept:
    what a command's `except ValueError` around its checks does."""
    refused = refusal(error)
    if refused is None:
        raise error
    raise refused from None
