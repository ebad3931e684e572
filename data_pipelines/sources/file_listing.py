"""The files a file source reads: `data.path` as a file, a folder read recursively, or a glob; and what identifies
them (a run's data fingerprint) without reading them."""

from __future__ import annotations

import concurrent.futures
import re

import ml_collections

import bert_jax
from bert_jax.storage import paths

_STAT_THREADS = 16  # a bucket answers one stat per request: ask side by side


def resolve_files(data_cfg: ml_collections.ConfigDict) -> list[str]:
    """The sorted files `data.path` names (file, directory, or glob; local, gs:// or s3://); fails if there are none.

    A directory is read recursively, leaving out hidden files and folders (`.name`). A glob
    may hold `*`, `?`, `[...]` and `**` (any depth): `gs://b/corpus/**/*.txt.gz`.
    """
    value = data_cfg.get("path", "")
    if not value:
        raise bert_jax.UserError(f"config.data.path is empty; source {data_cfg.source!r} needs files to read")
    if _has_wildcard(value):
        root, pattern = _split_glob(value)
        files = [f for relative, f in _walk_files(root) if pattern.fullmatch(relative)]
        if not files:
            raise bert_jax.MissingPathError(f"config.data.path={value!r}: the glob matches no files")
        return files
    path = paths.path(value)
    if path.is_file():
        return [value]
    if path.is_dir():
        files = [f for _, f in _walk_files(value)]
        if not files:
            raise bert_jax.MissingPathError(f"config.data.path={value!r} is a directory with no files")
        return files
    raise bert_jax.MissingPathError(f"config.data.path={value!r} does not exist")


def _has_wildcard(value: str) -> bool:
    return any(c in value for c in "*?[")


def _split_glob(value: str) -> tuple[str, re.Pattern]:
    """'gs://b/c/**/*.txt' -> ('gs://b/c', the pattern of the paths below it)."""
    parts = value.split("/")
    first = next(i for i, part in enumerate(parts) if _has_wildcard(part))
    return "/".join(parts[:first]) or ".", re.compile(_glob_regex("/".join(parts[first:])))


def _glob_regex(pattern: str) -> str:
    """glob -> regex over '/'-separated paths: `**/` any folders (or none), `*` and `?` within one name."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 1)) > i:
            out.append("[" + pattern[i + 1:end].replace("!", "^", 1) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def _walk_files(root: str) -> list[tuple[str, str]]:
    """(path relative to root, path) of every file below `root`, sorted, hidden ones left out.

    One listing per folder; in a bucket, one per prefix.
    """
    files, folders = [], [(paths.path(root), "")]
    if not folders[0][0].is_dir():
        return []
    while folders:
        folder, relative = folders.pop()
        for entry in folder.iterdir():
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                folders.append((entry, f"{relative}{entry.name}/"))
            else:
                files.append((f"{relative}{entry.name}", str(entry)))
    return sorted(files)


def file_fingerprints(files: list[str]) -> list[dict]:
    """Each file's path, size, mtime and (in a bucket) object generation or ETag: what changes when it is
    rewritten, without hashing a terabyte corpus at every start."""
    with concurrent.futures.ThreadPoolExecutor(_STAT_THREADS) as pool:
        return list(pool.map(_file_fingerprint, files))


def file_sizes(files: list[str]) -> list[int]:
    with concurrent.futures.ThreadPoolExecutor(_STAT_THREADS) as pool:
        return list(pool.map(lambda f: int(paths.path(f).stat().length), files))


def text_bytes(files: list[str]) -> int | None:
    """The files' text bytes, when none is compressed (a compressed file's text size is not known before it is
    read): a progress bar's total (prepare's, the tokenizer sample's, extend-vocab's); None shows the rate alone."""
    if not files or any(f.endswith((".gz", ".bz2", ".xz", ".zst", ".parquet")) for f in files):
        return None
    return sum(file_sizes(files))


def _file_fingerprint(path: str) -> dict:
    stat = paths.path(path).stat()
    entry = {"path": path, "size": stat.length, "mtime": stat.mtime}
    if paths.is_remote(path):
        # An object's generation (GCS) or ETag (S3) changes with every write, even one that
        # keeps its size within the same second.
        import fsspec  # noqa: PLC0415 (only buckets need it)

        filesystem, _ = fsspec.core.url_to_fs(path)
        info = filesystem.info(path)
        version = info.get("generation") or info.get("ETag") or info.get("etag")
        if version:
            entry["generation"] = str(version)
    return entry
