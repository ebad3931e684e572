"""Corpus sources: raw documents from files, TFDS or the embedded corpus, bad records counted.

`config.data.source` picks one:
  embedded   Python's own documentation (corpus.py); random access.
  text       plain text files (`data.path`: a file, a directory read recursively, or a glob;
             `.gz` read transparently). A blank line ends a document ("line", "sentence"
             segmenters); with "blank_line", paragraphs are segments and two blank lines in a
             row end a document. A file ends its last document.
  jsonl      one JSON object per line; the string `data.field` is one document.
  parquet    column `data.field` of Parquet files, one cell per document, read a record
             batch at a time (never the whole file).
  tfds       `tfds.data_source(data.tfds_name, split=data.tfds_split, data_dir=...)`: TFDS
             datasets built as ArrayRecord, read without TensorFlow; feature `data.field`;
             random access.
  prepared   ArrayRecord shards written by `python -m bert_jax.commands.prepare` (`data.path` is
             its output directory): already tokenized documents; random access only.

A raw document is `list[str]`, its segments (`data.segmenter`, see segmenters.py).

Bad input never stops a run (readers.py): a record (line, JSON object, cell, TFDS item) that is not
valid UTF-8, holds NUL or other control bytes, is longer than `data.max_line_bytes`, or
has no text is skipped and counted in `SkipStats` by reason; so are empty, binary and
unreadable files. Only configuration errors fail, and they fail when the source is
opened: a missing path, a glob matching nothing, a missing Parquet column.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import ml_collections

from bert_jax.storage import paths
from data_pipelines.sources import corpus, readers, segmenters
from data_pipelines.sources.readers import SkipStats  # noqa: F401 (part of this module's API)

SOURCES = ("embedded", "text", "jsonl", "parquet", "tfds", "prepared")
RANDOM_ACCESS_SOURCES = ("embedded", "tfds", "prepared")
FILE_SOURCES = ("text", "jsonl", "parquet")


def is_random_access(data_cfg: ml_collections.ConfigDict) -> bool:
    """Whether `open_random_access` serves this source (else stream it with iter_documents)."""
    _check_source_name(data_cfg)
    return data_cfg.source in RANDOM_ACCESS_SOURCES


def _check_source_name(data_cfg: ml_collections.ConfigDict) -> None:
    if data_cfg.source not in SOURCES:
        raise ValueError(f"config.data.source={data_cfg.source!r} is not one of {SOURCES}")


def resolve_files(data_cfg: ml_collections.ConfigDict) -> list[str]:
    """The sorted files `data.path` names (file, directory, or glob; local, gs:// or s3://); fails if there are none.

    A directory is read recursively, leaving out hidden files and folders (`.name`). A glob
    may hold `*`, `?`, `[...]` and `**` (any depth): `gs://b/corpus/**/*.txt.gz`.
    """
    value = data_cfg.get("path", "")
    if not value:
        raise ValueError(f"config.data.path is empty; source {data_cfg.source!r} needs files to read")
    if _has_wildcard(value):
        root, pattern = _split_glob(value)
        files = [f for relative, f in _walk_files(root) if pattern.fullmatch(relative)]
        if not files:
            raise FileNotFoundError(f"config.data.path={value!r}: the glob matches no files")
        return files
    path = paths.path(value)
    if path.is_file():
        return [value]
    if path.is_dir():
        files = [f for _, f in _walk_files(value)]
        if not files:
            raise FileNotFoundError(f"config.data.path={value!r} is a directory with no files")
        return files
    raise FileNotFoundError(f"config.data.path={value!r} does not exist")


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


def check_source(data_cfg: ml_collections.ConfigDict) -> list[str]:
    """Fails now, naming the config key, if the source cannot be read; returns its files.

    Checks the source name, the segmenter, that `data.path` names existing files, and that
    every Parquet file has column `data.field`. Returns [] for non-file sources.
    """
    _check_source_name(data_cfg)
    segmenters.check_segmenter(data_cfg.get("segmenter", "line"))
    if data_cfg.source in FILE_SOURCES:
        files = resolve_files(data_cfg)
        if data_cfg.source == "parquet":
            readers.check_parquet_columns(files, data_cfg.field)
        return files
    if data_cfg.source == "tfds" and not data_cfg.get("tfds_name", ""):
        raise ValueError("config.data.tfds_name is empty; source 'tfds' needs a dataset name")
    if data_cfg.source == "prepared":
        from data_pipelines.shards import records  # noqa: PLC0415 (imports array_record)

        records.read_manifest(data_cfg.path)
    return []


def iter_documents(
    data_cfg: ml_collections.ConfigDict,
    *,
    shard_index: int = 0,
    shard_count: int = 1,
    stats: SkipStats | None = None,
    start: int = 0,
) -> Iterator[list[str]]:
    """Streams this shard's raw documents (lists of segment strings) in a fixed order.

    Args:
      data_cfg: the `config.data` block (source, path, field, segmenter, ...).
      shard_index, shard_count: this reader's share, e.g. (process_index, process_count).
        With at least shard_count files, shard i reads whole files i, i + n, ...; with
        fewer Parquet files, row groups i, i + n, ... if there are enough; otherwise
        every shard reads every file and keeps documents i, i + n, ... (and only shard 0
        counts skipped records, so counts summed over shards stay right). Random-access
        sources (embedded, tfds) give shard i items i, i + n, ... The shares are disjoint
        and together cover the source.
      stats: counts skipped records by reason (see SkipStats).
      start: how many of this shard's documents to skip first, to resume a stream. The
        skipped documents are re-read and parsed (not tokenized): resuming costs a pass
        over that much text.

    Raises (now, not on first `next`): FileNotFoundError / ValueError naming the config
    key when the source cannot be read. Source "prepared" holds tokenized documents:
    read it with `open_random_access`.
    """
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index={shard_index} is not in [0, shard_count={shard_count})")
    if start < 0:
        raise ValueError(f"start={start} must be >= 0")
    files = check_source(data_cfg)
    if data_cfg.source == "prepared":
        raise ValueError(
            "config.data.source='prepared' holds tokenized documents: read it with "
            "sources.open_random_access, not iter_documents"
        )
    stats = SkipStats() if stats is None else stats
    few_parquet_files = data_cfg.source == "parquet" and len(files) < shard_count
    row_groups = readers.parquet_row_groups(files) if few_parquet_files else []
    if data_cfg.source in FILE_SOURCES and len(files) >= shard_count:
        documents = readers.file_documents(data_cfg, files[shard_index::shard_count], stats)
    elif len(row_groups) >= shard_count:
        # Fewer Parquet files than shards: share out row groups instead of whole files.
        if shard_index == 0:
            stats.skip("empty_file", sum(1 for f in files if f not in {path for path, _ in row_groups}))
        documents = readers.parquet_documents(data_cfg, row_groups[shard_index::shard_count], stats)
    elif data_cfg.source in FILE_SOURCES:
        # Every shard reads every file; shard 0 alone counts what it skips.
        counted = stats if shard_index == 0 else readers.DiscardStats()
        every_document = readers.file_documents(data_cfg, files, counted)
        documents = (d for i, d in enumerate(every_document) if i % shard_count == shard_index)
    else:
        documents = _random_access_documents(data_cfg, stats, shard_index, shard_count)
    return _skip(documents, start)


def _skip(documents: Iterator[list[str]], start: int) -> Iterator[list[str]]:
    for index, document in enumerate(documents):
        if index >= start:
            yield document


def _random_access_documents(data_cfg, stats: SkipStats, shard_index: int, shard_count: int):
    """Items shard_index, shard_index + shard_count, ... of the table; bad (empty) ones left out."""
    table = open_random_access(data_cfg, stats)
    for index in range(shard_index, len(table), shard_count):
        document = table[index]
        if document:
            yield document


def open_random_access(data_cfg: ml_collections.ConfigDict, stats: SkipStats | None = None) -> Sequence:
    """Random access to a source's documents, for a global shuffle (grain MapDataset).

    Item i is, by source:
      embedded  a raw document, list[str];
      tfds      a raw document, list[str]; [] when the item was bad (skipped, counted in stats);
      prepared  a tokenized document, int32 ids per segment (records.decode_document: a FlatDocument).
    The returned objects pickle (grain worker processes).
    """
    check_source(data_cfg)
    if data_cfg.source == "embedded":
        return list(corpus.embedded_documents())
    if data_cfg.source == "tfds":
        return TfdsDocuments(data_cfg, stats)
    if data_cfg.source == "prepared":
        from data_pipelines.shards import records  # noqa: PLC0415

        return records.PreparedDocuments(data_cfg.path, data_cfg.get("shard_cache_bytes", 0))
    raise ValueError(
        f"config.data.source={data_cfg.source!r} is a stream, not random access; read it with "
        f"sources.iter_documents (random access: {RANDOM_ACCESS_SOURCES})"
    )


class TfdsDocuments(Sequence):
    """A TFDS ArrayRecord data source as raw documents; bad items read as [] (and are counted)."""

    def __init__(self, data_cfg: ml_collections.ConfigDict, stats: SkipStats | None = None):
        import tensorflow_datasets as tfds  # noqa: PLC0415 (slow import; only this source needs it)

        self._field = data_cfg.get("field", "text")
        self._segmenter = data_cfg.get("segmenter", "line")
        self._max_bytes = data_cfg.get("max_line_bytes", 1_000_000)
        self._stats = SkipStats() if stats is None else stats
        data_dir = data_cfg.get("tfds_data_dir", "") or None
        try:
            self._source = tfds.data_source(data_cfg.tfds_name, split=data_cfg.tfds_split, data_dir=data_dir)
        except Exception as e:  # tfds raises several types for a dataset it cannot find.
            raise FileNotFoundError(
                f"config.data.tfds_name={data_cfg.tfds_name!r} split={data_cfg.tfds_split!r} "
                f"(data_dir={data_dir!r}) cannot be opened as an ArrayRecord TFDS source: {e}"
            ) from e

    def __len__(self) -> int:
        return len(self._source)

    def __getitem__(self, index: int) -> list[str]:
        item = self._source[index]
        if self._field not in item:
            raise ValueError(
                f"config.data.field={self._field!r} is not a feature of the TFDS dataset; "
                f"features: {sorted(item)}"
            )
        text = readers.record_text(item[self._field], self._max_bytes, self._stats)
        return [] if text is None else readers.document_segments(text, self._segmenter, self._stats)
