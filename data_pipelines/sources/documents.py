"""Corpus sources: raw documents from files, TFDS or the embedded corpus, bad records counted.

`config.data.source` names a registered source class (source.py's contract; file_sources.py and
table_sources.py hold them): embedded, text, jsonl, parquet, tfds, prepared. `source_of` is the one place that
maps the name to its class; everything else asks the object.

A raw document is `list[str]`, its segments (`data.segmenter`, see segmenters.py).

Bad input never stops a run (readers.py): a record (line, JSON object, cell, TFDS item) that is not
valid UTF-8, holds NUL or other control bytes, is longer than `data.max_line_bytes`, or
has no text is skipped and counted in `SkipStats` by reason; so are empty, binary and
unreadable files. Only configuration errors fail, and they fail when the source is
opened: a missing path, a glob matching nothing, a missing Parquet column.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import ml_collections

from data_pipelines.sources import file_sources, table_sources  # noqa: F401 (each registers its sources)
from data_pipelines.sources.file_listing import resolve_files  # noqa: F401 (part of this module's API)
from data_pipelines.sources.readers import SkipStats  # noqa: F401 (part of this module's API)
from data_pipelines.sources.source import SOURCES, FileSource, Source, TableSource  # noqa: F401 (the same)


def source_of(data_cfg: ml_collections.ConfigDict, key: str = "config.data.source") -> Source:
    """The source `data_cfg.source` names, over data_cfg; `bert_jax.UserError` naming `key` for an unknown name."""
    return SOURCES.get(data_cfg.source, key)(data_cfg)


def is_random_access(data_cfg: ml_collections.ConfigDict) -> bool:
    """Whether `open_random_access` serves this source (else stream it with iter_documents)."""
    return isinstance(source_of(data_cfg), TableSource)


def check_source(data_cfg: ml_collections.ConfigDict) -> list[str]:
    """Fails now, naming the config key, if the source cannot be read; returns its files.

    Checks the source name, the segmenter, that `data.path` names existing files, and that
    every Parquet file has column `data.field`. Returns [] for sources read by index.
    """
    return source_of(data_cfg).check()


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
    stats = SkipStats() if stats is None else stats
    return _skip(source_of(data_cfg).documents(shard_index, shard_count, stats), start)


def _skip(documents: Iterator[list[str]], start: int) -> Iterator[list[str]]:
    for index, document in enumerate(documents):
        if index >= start:
            yield document


def open_random_access(data_cfg: ml_collections.ConfigDict, stats: SkipStats | None = None) -> Sequence:
    """Random access to a source's documents, for a global shuffle (grain MapDataset).

    Item i is, by source:
      embedded  a raw document, list[str];
      tfds      a raw document, list[str]; [] when the item was bad (skipped, counted in stats);
      prepared  a tokenized document, int32 ids per segment (prepared.decode_document: a FlatDocument).
    The returned objects pickle (grain worker processes).
    """
    source = source_of(data_cfg)
    if not isinstance(source, TableSource):
        by_index = tuple(name for name, kind in SOURCES.items() if issubclass(kind, TableSource))
        raise ValueError(f"config.data.source={data_cfg.source!r} is a stream, not random access; read it with "
                         f"sources.iter_documents (random access: {by_index})")
    source.check()
    return source.table(stats)
