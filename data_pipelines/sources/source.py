"""What a data source is: one class per value of `config.data.source`, registered by name, with one contract.

A source turns `config.data` into raw documents (`list[str]`, its segments) or, for `prepared`, tokenized ones. It
either streams its files (`FileSource`: text, jsonl, parquet; a host reads its share of the files in order) or
serves its documents by index (`TableSource`: embedded, tfds, prepared; a global shuffle reads any of them). Every
stage asks the source object what differs between kinds (`tokenized`, `sharded`, `bundled_tokenizer`,
`fingerprint`) and never branches on the name: a new source is a class here-beside and one `@registered_as`.
levanter's ShardedDataSource is the model (a source is a class, not a string switched in twelve files).
"""

from __future__ import annotations

import abc
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import ClassVar

import ml_collections

from bert_jax.registry import Registry
from data_pipelines.sources import file_listing, readers, segmenters
from data_pipelines.sources.readers import SkipStats

SOURCES: Registry[type[Source]] = Registry("config.data.source", "sources")


class Source(abc.ABC):
    """One source kind over one `config.data` block (its path, field, segmenter, ...)."""

    name: ClassVar[str]  # its value of config.data.source (set by registered_as)
    tokenized: ClassVar[bool] = False  # its documents are int32 ids already (prepare's output)
    sharded: ClassVar[bool] = False  # its table comes in shards (`shard_ranges()`) a host may read whole
    # What gives it more documents, when a split would hold none ({where}: its path); a one-line fix for the user.
    more_documents: ClassVar[str] = "give it more documents"

    def __init__(self, data_cfg: ml_collections.ConfigDict):
        self.cfg = data_cfg

    def check(self) -> list[str]:
        """Fails now, naming the config key, if the source cannot be read; returns the files it reads ([] for none)."""
        segmenters.check_segmenter(self.cfg.get("segmenter", "line"))
        return []

    @abc.abstractmethod
    def documents(self, shard_index: int, shard_count: int, stats: SkipStats) -> Iterator:
        """This shard's documents in a fixed order (see documents.iter_documents)."""

    @abc.abstractmethod
    def fingerprint(self) -> dict:
        """What identifies the data it reads, without reading it all (a resume refuses a changed one)."""

    def bundled_tokenizer(self) -> str | None:
        """The folder of the tokenizer its documents were tokenized with, for a tokenized source; else None."""
        return None


class FileSource(Source):
    """A source read from the files `data.path` names, a record at a time (readers.py), bad records counted."""

    def files(self) -> list[str]:
        return file_listing.resolve_files(self.cfg)

    def check(self) -> list[str]:
        super().check()
        return self.files()

    @abc.abstractmethod
    def read_file(self, path: str, stats: SkipStats) -> Iterator[list[str]]:
        """One file's raw documents."""

    def file_documents(self, files: Iterable[str], stats: SkipStats) -> Iterator[list[str]]:
        """The raw documents of `files` in order; the rest of an unreadable file (a truncated .gz) skipped, counted."""
        for path in files:
            try:
                yield from self.read_file(path, stats)
            except GeneratorExit:  # Closed (at exit zlib may already be gone): nothing to count.
                raise
            except (OSError, EOFError, zlib.error) as e:
                readers.log.warning("skipping the rest of unreadable file %s: %s", path, e)
                stats.skip("unreadable_file")

    def documents(self, shard_index: int, shard_count: int, stats: SkipStats) -> Iterator[list[str]]:
        """With at least shard_count files, shard i reads whole files i, i + n, ...; otherwise every shard reads
        every file and keeps documents i, i + n, ... (only shard 0 counts what it skips, so sums stay right)."""
        files = self.check()
        if len(files) >= shard_count:
            return self.file_documents(files[shard_index::shard_count], stats)
        return self.every_nth(files, shard_index, shard_count, stats)

    def every_nth(self, files: list[str], shard_index: int, shard_count: int, stats: SkipStats):
        counted = stats if shard_index == 0 else readers.DiscardStats()
        every_document = self.file_documents(files, counted)
        return (d for i, d in enumerate(every_document) if i % shard_count == shard_index)

    def fingerprint(self) -> dict:
        # Files by size, mtime and object generation, not content: touching one counts as a change
        # (config.allow_data_change=True goes on).
        return {"source": self.name, "path": self.cfg.path,
                "files": file_listing.file_fingerprints(file_listing.resolve_files(self.cfg))}


class TableSource(Source):
    """A source whose documents are read by index: a global shuffle (grain MapDataset) reads any of them."""

    @abc.abstractmethod
    def table(self, stats: SkipStats | None = None) -> Sequence:
        """Item i is document i (a raw document, [] for a bad one, counted; or a tokenized one). It pickles (grain
        worker processes)."""

    def documents(self, shard_index: int, shard_count: int, stats: SkipStats) -> Iterator:
        """Items shard_index, shard_index + shard_count, ... of the table; bad (empty) ones left out."""
        self.check()
        table = self.table(stats)
        items = map(table.__getitem__, range(shard_index, len(table), shard_count))
        return (document for document in items if len(document))
