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
from collections.abc import Collection

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


def fresh(value: str | os.PathLike) -> epath.Path:
    """`path(value)`, after forgetting the bucket listings this process cached (gcsfs and s3fs keep them).

    For reading what other processes write: a launcher watching a run's checkpoints and DONE
    would otherwise see the folders as they were when it first looked.
    """
    p = path(value)
    if is_remote(p):
        from etils.epath import backend  # noqa: PLC0415

        backend.fsspec_backend.fs(str(p)).invalidate_cache()
    return p


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


def files_under(folder: str | os.PathLike):
    """Every file below `folder`, walked a level at a time (a bucket's path has no recursive glob)."""
    for child in path(folder).iterdir():
        if child.is_dir():
            yield from files_under(child)
        else:
            yield child


def move_tree(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Moves a folder: locally a rename; in a bucket, which has no folders, each object copied (in the store) and then
    deleted. fsspec's recursive rename also copies the prefixes it lists, which on S3 are no objects (NoSuchKey)."""
    src, dst = path(src), path(dst)
    if not is_remote(src):
        src.rename(dst)
        return
    files = list(files_under(src))
    for file in files:
        file.copy(dst / file.relative_to(src), overwrite=True)
    for file in files:
        file.unlink()


def cache_root() -> epath.Path:
    """Where bucket objects are cached: $BERT_JAX_CACHE_DIR, else bert_jax_cache in the temp dir."""
    return epath.Path(os.environ.get(CACHE_ENV) or epath.Path(tempfile.gettempdir()) / "bert_jax_cache")


def local_copy(remote: str | os.PathLike, max_cache_bytes: int = 0, in_use: Collection[str] = ()) -> str:
    """A local file holding `remote`'s bytes, for libraries that read only local disk.

    Cached under cache_root(), keyed by URL and checked by size, so a resume or a second
    worker on the same VM reuses it. Logged, because the copy costs local disk and a
    download. With max_cache_bytes > 0 the cache stays within that many bytes: before a
    download, the least recently used cached files (a hit counts as a use) are deleted,
    except `in_use` (local paths a reader holds open) and this one; ValueError (naming
    config.data.shard_cache_bytes) if that cannot make room.
    """
    if not is_remote(remote):
        return str(remote)
    remote = path(remote)
    key = hashlib.sha256(str(remote).encode()).hexdigest()[:16]
    root = cache_root()
    local = root / key / remote.name
    size = remote.stat().length
    if local.exists() and local.stat().length == size:
        os.utime(local)  # Most recently used.
        return str(local)
    if max_cache_bytes:
        _make_room(root, size, max_cache_bytes, {str(local), *map(str, in_use)})
    log.info("caching %s (%d bytes) in %s: the reader needs a local file", remote, size, local)
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.parent / f".{local.name}.{os.getpid()}.tmp"
    with remote.open("rb") as src, tmp.open("wb") as dst:
        while chunk := src.read(1 << 22):
            dst.write(chunk)
    tmp.replace(local)
    return str(local)


def cached_files(root: epath.Path) -> list[tuple[float, int, epath.Path]]:
    """(mtime, bytes, path) of the files cached under `root` (key folders, one level), oldest first."""
    if not root.is_dir():
        return []
    found = []
    for folder in root.iterdir():
        for f in folder.iterdir() if folder.is_dir() else ():
            if not f.name.startswith("."):  # (downloads in progress)
                stat = f.stat()
                found.append((stat.mtime, stat.length, f))
    return sorted(found, key=lambda item: item[0])


def _make_room(root: epath.Path, size: int, max_bytes: int, keep: set[str]) -> None:
    """Deletes least recently used cached files not in `keep` until `size` more bytes fit in max_bytes."""
    files = cached_files(root)
    total = sum(length for _, length, _ in files)
    for _, length, f in files:
        if total + size <= max_bytes:
            return
        if str(f) not in keep:
            log.info("shard cache over %d bytes: evicting %s (%d bytes, least recently used)", max_bytes, f, length)
            f.unlink(missing_ok=True)
            total -= length
    if total + size > max_bytes:  # only files in use are left
        raise ValueError(
            f"config.data.shard_cache_bytes={max_bytes} cannot hold a {size}-byte shard beside the "
            f"{total} bytes of shards in use in {root}; raise it (a host needs room for the shards it reads at once)"
        )
