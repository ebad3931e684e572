"""Checks, before step 0, that the workdir is writable and the inputs readable.

A bucket that does not exist, a denied permission or missing credentials would otherwise
surface minutes later (after compilation), or never: gcsfs without credentials falls
back to anonymous access and retries a failing request for about a minute. Each check
here answers within `DEADLINE_S` with a `StorageError` naming the URL, the operation,
and how to set credentials.
"""
from __future__ import annotations

import concurrent.futures
import os

from bert_jax import UserError
from bert_jax.storage import paths

DEADLINE_S = 15.0

_HINTS = {
    "gs://": (
        "On a TPU VM the VM's service account is used (application default credentials); elsewhere run "
        "`gcloud auth application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a key file. "
        "The account needs roles/storage.objectAdmin on the bucket (objectViewer for inputs)."
    ),
    "s3://": (
        "Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (and AWS_ENDPOINT_URL for an "
        "S3-compatible store). The credentials need s3:PutObject/GetObject/ListBucket on the bucket."
    ),
}


class StorageError(UserError, RuntimeError):
    """A workdir or input cannot be used; the message says which URL, what failed and what to do."""


def _hint(url: str) -> str:
    return next((h for scheme, h in _HINTS.items() if str(url).startswith(scheme)), "")


def _fail(url: str, operation: str, cause: BaseException | str) -> StorageError:
    if isinstance(cause, FileNotFoundError) and paths.is_remote(url):
        bucket = "/".join(str(url).split("/")[:3])
        reason = (f"not found: check that the bucket {bucket} exists, is visible to these credentials, "
                  f"and holds the path")
    elif isinstance(cause, PermissionError) or any(w in str(cause) for w in ("Forbidden", "AccessDenied", " 403")):
        reason = f"permission denied: {str(cause)[:300]}"
    elif isinstance(cause, BaseException):
        reason = f"{type(cause).__name__}: {str(cause)[:300]}"
    else:
        reason = cause
    return StorageError(" ".join(s for s in (f"cannot {operation} {url} ({reason}).", _hint(url)) if s))


def _within_deadline(url: str, operation: str, check) -> None:
    """Runs `check()`; a StorageError if it raises or takes longer than DEADLINE_S (client retries)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        pool.submit(check).result(timeout=DEADLINE_S)
    except concurrent.futures.TimeoutError:
        raise _fail(url, operation, f"no answer within {DEADLINE_S:.0f} s: unreachable, or the client "
                                    f"is retrying a refused request") from None
    except StorageError:
        raise
    except Exception as error:  # noqa: BLE001  (every client error means: this path cannot be used)
        raise _fail(url, operation, error) from error
    finally:
        pool.shutdown(wait=False)  # a hung client request must not hold the run's exit


def _check_credentials(url: str) -> None:
    """gcsfs silently goes anonymous without credentials; ask google.auth first, which answers at once."""
    if not str(url).startswith("gs://") or os.environ.get("STORAGE_EMULATOR_HOST"):
        return
    import google.auth  # noqa: PLC0415 (only bucket users need it)
    from google.auth import exceptions  # noqa: PLC0415

    try:
        google.auth.default()
    except exceptions.DefaultCredentialsError as error:
        raise _fail(url, "find credentials for", error) from error


def check_writable(workdir: str, process_index: int = 0) -> None:
    """Writes and deletes a small object in `workdir` (one per process: each writes checkpoint shards)."""
    if not paths.is_remote(workdir):
        return _check_local_writable(workdir)
    _check_credentials(workdir)
    probe = paths.path(workdir) / f".write_check.{process_index}"

    def write_and_delete():
        probe.write_text("bert_jax write check")
        probe.unlink()

    _within_deadline(workdir, "write to", write_and_delete)


def _check_local_writable(workdir: str) -> None:
    try:
        paths.path(workdir).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _fail(workdir, "create the workdir", error) from error
    if not os.access(workdir, os.W_OK):
        raise _fail(workdir, "write to", "permission denied")


def check_readable(url: str, what: str) -> None:
    """That `url` (a file, a folder, or a glob's folder) exists and can be read. `what` names the config key.

    Whether a glob matches anything is sources.resolve_files' check; this one makes sure the
    listing it does will not hang on credentials or a missing bucket.
    """
    if not paths.is_remote(url):
        return  # local inputs keep their own, earlier checks (sources.resolve_files, ...)
    _check_credentials(url)
    parts = url.split("/")
    wildcard = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), None)
    target = paths.path("/".join(parts[:wildcard]) if wildcard is not None else url)

    def read_head():
        if target.is_dir():
            next(iter(target.iterdir()), None)
            return
        if not target.exists():
            raise FileNotFoundError(url)
        with target.open("rb") as f:
            f.read(1)

    _within_deadline(url, f"read {what}", read_head)
