"""The path layer: one `epath.Path` for local paths, `gs://` (gcsfs) and `s3://` (s3fs).

An object store has no append and no atomic rename, but a single object upload is
atomic: readers see the old object or the new one, never half. So every file this
project rewrites is written whole (`write_atomically`), and files that grow (metrics,
TensorBoard events) are staged locally and uploaded whole (train/metrics_writer.py).
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile

from etils import epath

log = logging.getLogger(__name__)

REMOTE_SCHEMES = ("gs://", "s3://")
# Where bucket objects a library can only read from local disk (ArrayRecord shards) are cached.
CACHE_ENV = "BERT_JAX_CACHE_DIR"


def path(value: str | os.PathLike) -> epath.Path:
    """The epath.Path of a user path; `gs://b/x` stays a URL (never `$PWD/gs:/b/x`)."""
    return value if isinstance(value, epath.Path) else epath.Path(value)


def is_remote(value: str | os.PathLike) -> bool:
    return str(value).startswith(REMOTE_SCHEMES)


def absolute(value: str | os.PathLike) -> str:
    """An absolute form that orbax accepts: URLs as they are, local paths resolved."""
    return str(value) if is_remote(value) else str(path(value).resolve())


def write_atomically(target: str | os.PathLike, data: str | bytes) -> None:
    """Replaces `target` whole: a reader (or a resume after a kill) sees the old content or the new.

    Locally through a temporary sibling and a rename; in a bucket an upload is already atomic.
    """
    target = path(target)
    mode = "wb" if isinstance(data, bytes) else "w"
    if is_remote(target):
        # No mkdir: a bucket has no folders, and gcsfs's mkdir would create a missing bucket.
        with target.open(mode) as f:
            f.write(data)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp"
    with tmp.open(mode) as f:
        f.write(data)
    tmp.replace(target)


def copy_file(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copies one file between any two places (local, gs://, s3://)."""
    write_atomically(dst, path(src).read_bytes())


def local_copy(remote: str | os.PathLike) -> str:
    """A local file holding `remote`'s bytes, for libraries that read only local disk.

    Cached under $BERT_JAX_CACHE_DIR (default: the temp dir), keyed by URL and checked by
    size, so a resume or a second worker on the same VM reuses it. Logged, because the
    copy costs local disk and a download.
    """
    if not is_remote(remote):
        return str(remote)
    remote = path(remote)
    key = hashlib.sha256(str(remote).encode()).hexdigest()[:16]
    root = epath.Path(os.environ.get(CACHE_ENV) or epath.Path(tempfile.gettempdir()) / "bert_jax_cache")
    local = root / key / remote.name
    size = remote.stat().length
    if local.exists() and local.stat().length == size:
        return str(local)
    log.info("caching %s (%d bytes) in %s: the reader needs a local file", remote, size, local)
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.parent / f".{local.name}.{os.getpid()}.tmp"
    with remote.open("rb") as src, tmp.open("wb") as dst:
        while chunk := src.read(1 << 22):
            dst.write(chunk)
    tmp.replace(local)
    return str(local)
