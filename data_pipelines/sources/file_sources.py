"""The file sources: plain text, JSONL and Parquet files under `data.path` (a file, a folder read recursively, or
a glob; `.gz` read transparently), bad records skipped and counted (readers.py)."""

from __future__ import annotations

from bert_jax.registry import registered_as
from data_pipelines.sources import readers
from data_pipelines.sources.readers import SkipStats
from data_pipelines.sources.source import SOURCES, FileSource


def _segmenter(cfg) -> str:
    return cfg.get("segmenter", "line")


def _max_bytes(cfg) -> int:
    return cfg.get("max_line_bytes", 1_000_000)


@registered_as(SOURCES, "text")
class TextSource(FileSource):
    """Plain text. A blank line ends a document ("line", "sentence" segmenters); with "blank_line", paragraphs are
    segments and two blank lines in a row end a document. A file ends its last document."""

    more_documents = ("put a blank line between its documents (the text source ends one there), or split it into "
                      "several files (a document never spans two), e.g. `split -l 1000 {where} part-`")

    def read_file(self, path: str, stats: SkipStats):
        return readers.text_file_documents(path, _segmenter(self.cfg), _max_bytes(self.cfg), stats)


@registered_as(SOURCES, "jsonl")
class JsonlSource(FileSource):
    """One JSON object per line; its string `data.field` is one document."""

    def read_file(self, path: str, stats: SkipStats):
        return readers.jsonl_file_documents(path, self.cfg.field, _segmenter(self.cfg), _max_bytes(self.cfg), stats)


@registered_as(SOURCES, "parquet")
class ParquetSource(FileSource):
    """Column `data.field` of Parquet files, one cell per document, read a record batch at a time (never the whole
    file). With fewer files than shards, the shards share out row groups instead."""

    def check(self) -> list[str]:
        files = super().check()
        readers.check_parquet_columns(files, self.cfg.field)
        return files

    def read_file(self, path: str, stats: SkipStats):
        return readers.parquet_file_documents(path, self.cfg.field, _segmenter(self.cfg), _max_bytes(self.cfg), stats)

    def documents(self, shard_index: int, shard_count: int, stats: SkipStats):
        files = self.check()
        if len(files) >= shard_count:
            return self.file_documents(files[shard_index::shard_count], stats)
        row_groups = readers.parquet_row_groups(files)
        if len(row_groups) < shard_count:
            return self.every_nth(files, shard_index, shard_count, stats)
        if shard_index == 0:
            stats.skip("empty_file", sum(1 for f in files if f not in {path for path, _ in row_groups}))
        return readers.parquet_documents(self.cfg, row_groups[shard_index::shard_count], stats)
