"""A storage operation retried through a transient fault: a bucket's dropped connection, a timeout, a reset.

The bucket clients (gcsfs, s3fs) retry a request that fails with a retryable HTTP status; what reaches the caller
after that as an OSError (a connection torn down mid-download, a timeout) is retried here, a few times with a
growing wait, and then raised as it is, its cause kept. Faults that another try cannot mend (a missing path, a
refused permission) are raised at once, and every other exception (a MemoryError, a client's own error) passes
through untouched: none of them is a storage hiccup.
"""
import time
from typing import Callable, TypeVar

from absl import logging

T = TypeVar("T")

# OSErrors that say something about the path, not the connection: the same call fails the same way again.
LASTING = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError)
ATTEMPTS = 4
FIRST_WAIT_S = 1.0  # then 2, 4: about 7 s in all before the fault is raised


def retried(operation: Callable[[], T], what: str) -> T:
    """`operation()`, tried up to ATTEMPTS times while it raises a transient OSError; `what` names it in the log."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return operation()
        except LASTING:
            raise
        except OSError as error:
            if attempt == ATTEMPTS:
                raise
            wait = FIRST_WAIT_S * 2 ** (attempt - 1)
            logging.warning("%s failed (%s: %s); trying again in %.0f s (attempt %d of %d)", what,
                            type(error).__name__, error, wait, attempt + 1, ATTEMPTS)
            time.sleep(wait)
    raise AssertionError("unreachable")
