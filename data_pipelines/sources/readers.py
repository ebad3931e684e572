"""Reading one file (or one TFDS item) into raw documents; bad records skipped and counted.

A record is a line of a text file, a JSONL object, a Parquet cell or a TFDS item. One that
is not valid UTF-8, holds NUL or other control bytes, is longer than `max_bytes`, or
holds no text is skipped and counted in `SkipStats` by reason; so are empty, binary and
unreadable files. A long line is consumed in bounded pieces, never held whole, and never
truncated: it is skipped and counted. The source classes (file_sources.py) pick the files and the shard.
"""

from __future__ import annotations

import collections
import contextlib
import gzip
import io
import json
import logging as std_logging
import re
import threading
import zlib
from collections.abc import Iterator

from bert_jax.storage import paths
from bert_jax.storage.retry import retried
from data_pipelines.sources import segmenters

# C0 control characters other than tab, newline, vertical tab, form feed, carriage return;
# and DEL. Text holding them is binary data or corrupt.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
_BINARY_SNIFF_BYTES = 8192
_PARQUET_BATCH_ROWS = 1024

log = std_logging.getLogger(__name__)


class SkipStats:
    """Counts of skipped input by reason. Safe to share between threads of one process.

    Reasons: invalid_utf8, control_characters, line_too_long, invalid_json, missing_field,
    empty_document, empty_file, binary_file, unreadable_file. Workers in other processes
    keep their own and `merge` them.
    """

    def __init__(self, counts: dict[str, int] | None = None):
        self._counts = collections.Counter(counts or {})
        self._lock = threading.Lock()

    def skip(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self._counts[reason] += count

    def merge(self, counts: dict[str, int]) -> None:
        with self._lock:
            self._counts.update(counts)

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted((k, v) for k, v in self._counts.items() if v))

    def total(self) -> int:
        return sum(self.as_dict().values())

    def log_line(self) -> str:
        counts = self.as_dict()
        if not counts:
            return "skipped nothing"
        return f"skipped {sum(counts.values())} record(s): " + ", ".join(
            f"{reason}={count}" for reason, count in counts.items()
        )

    def __getstate__(self):
        return {"counts": self.as_dict()}

    def __setstate__(self, state):
        self.__init__(state["counts"])


class DiscardStats(SkipStats):
    """Counts nothing: for shards that read records another shard already counts."""

    def skip(self, reason: str, count: int = 1) -> None:
        pass


def record_text(value, max_bytes: int, stats: SkipStats) -> str | None:
    """A record's text, or None (counted) if it is missing, too long, not UTF-8, or binary."""
    if value is None:
        stats.skip("missing_field")
        return None
    if hasattr(value, "item") and not isinstance(value, (bytes, str)):
        value = value.item()  # A numpy scalar from TFDS.
    if isinstance(value, bytes):
        if len(value) > max_bytes:
            stats.skip("line_too_long")
            return None
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            stats.skip("invalid_utf8")
            return None
    if not isinstance(value, str):
        stats.skip("missing_field")
        return None
    if len(value) > max_bytes:
        stats.skip("line_too_long")
        return None
    if _CONTROL.search(value):
        stats.skip("control_characters")
        return None
    return value


def document_segments(text: str, segmenter: str, stats: SkipStats) -> list[str]:
    segments = segmenters.split_text(text, segmenter)
    if not segments:
        stats.skip("empty_document")
    return segments


@contextlib.contextmanager
def _open_binary(path: str):
    """A file or bucket object, streamed (gcsfs/s3fs read ahead in blocks), gunzipped on the fly."""
    with paths.path(path).open("rb") as f:
        if not path.endswith(".gz"):
            # gcsfs/s3fs files take no size in readline(): a standard buffer over them does.
            yield f if isinstance(f, io.BufferedIOBase) else io.BufferedReader(f)
            return
        with gzip.GzipFile(fileobj=f, mode="rb") as unzipped:
            yield unzipped


def _bounded_lines(f, max_bytes: int, stats: SkipStats) -> Iterator[bytes]:
    """Lines of a binary file; a line over max_bytes is consumed in bounded pieces, counted."""
    while True:
        line = f.readline(max_bytes + 1)
        if not line:
            return
        if len(line) > max_bytes:
            while line and not line.endswith(b"\n"):
                line = f.readline(max_bytes + 1)
            stats.skip("line_too_long")
            continue
        yield line


def _decoded_lines(path: str, max_bytes: int, stats: SkipStats) -> Iterator[str | None]:
    """A file's lines as text without line ends; None for a bad line (counted).

    A file whose first bytes hold NUL is binary: skipped whole. An empty file is counted.
    A file that breaks off (a truncated .gz) ends where it breaks, counted as unreadable.
    """
    try:
        yield from _decoded_lines_unguarded(path, max_bytes, stats)
    except GeneratorExit:
        raise
    except (OSError, EOFError, zlib.error) as e:
        log.warning("skipping the rest of unreadable file %s: %s", path, e)
        stats.skip("unreadable_file")


def _decoded_lines_unguarded(path: str, max_bytes: int, stats: SkipStats) -> Iterator[str | None]:
    with _open_binary(path) as f:
        head = f.read(_BINARY_SNIFF_BYTES)
        if not head:
            stats.skip("empty_file")
            return
        if b"\x00" in head:
            stats.skip("binary_file")
            return
        f.seek(0)
        first = True
        for raw in _bounded_lines(f, max_bytes, stats):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                stats.skip("invalid_utf8")
                yield None
                continue
            if first:
                line, first = line.lstrip("\ufeff"), False  # A byte-order mark.
            line = line.rstrip("\r\n")
            if _CONTROL.search(line):
                stats.skip("control_characters")
                yield None
                continue
            yield line


def text_file_documents(path: str, segmenter: str, max_bytes: int, stats: SkipStats):
    segments: list[str] = []
    paragraph: list[str] = []
    blank_run = 0
    for line in _decoded_lines(path, max_bytes, stats):
        if line is None:  # A bad line: counted; the document goes on without it.
            continue
        if line.strip():
            blank_run = 0
            if segmenter == "blank_line":
                paragraph.append(line.strip())
            else:
                segments.extend(segmenters.split_line(line, segmenter))
            continue
        blank_run += 1
        if segmenter == "blank_line":
            if paragraph:
                segments.append(" ".join(" ".join(paragraph).split()))
                paragraph = []
            if blank_run < 2:
                continue
        if segments:
            yield segments
            segments = []
    if paragraph:
        segments.append(" ".join(" ".join(paragraph).split()))
    if segments:
        yield segments


def jsonl_file_documents(path: str, field: str, segmenter: str, max_bytes: int, stats: SkipStats):
    for line in _decoded_lines(path, max_bytes, stats):
        if line is None or not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            stats.skip("invalid_json")
            continue
        value = record.get(field) if isinstance(record, dict) else None
        text = record_text(value, max_bytes, stats)
        if text is not None:
            document = document_segments(text, segmenter, stats)
            if document:
                yield document


def _schema_names(path: str) -> list[str]:
    import pyarrow.parquet as pq  # noqa: PLC0415 (only this source needs it)

    with paths.path(path).open("rb") as f:
        return pq.read_schema(f).names


def check_parquet_columns(files: list[str], field: str) -> None:
    """Each file is Parquet and holds the column `field`. Only a file that is not Parquet is named so: a storage
    fault on the way (a bucket's dropped connection) is tried again and then raised with its cause, and any other
    error (a MemoryError) passes through as it is."""
    import pyarrow as pa  # noqa: PLC0415

    for path in files:
        try:
            names = retried(lambda path=path: _schema_names(path), f"reading the Parquet schema of {path}")
        except pa.ArrowInvalid as e:  # what pyarrow raises for bytes that are not Parquet (a ValueError)
            raise ValueError(f"config.data.path: {path} is not a readable Parquet file: {e}") from e
        if field not in names:
            raise ValueError(
                f"config.data.field={field!r} is not a column of {path}; columns: {names}"
            )


def parquet_row_groups(files: list[str]) -> list[tuple[str, int]]:
    """(file, row group) of every non-empty row group, in file order."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    groups = []
    for path in files:
        with paths.path(path).open("rb") as f:
            metadata = pq.read_metadata(f)
        groups.extend((path, g) for g in range(metadata.num_row_groups) if metadata.row_group(g).num_rows)
    return groups


def parquet_documents(data_cfg, row_groups: list[tuple[str, int]], stats: SkipStats):
    segmenter, max_bytes = data_cfg.get("segmenter", "line"), data_cfg.get("max_line_bytes", 1_000_000)
    for path, group in row_groups:
        try:
            yield from parquet_file_documents(path, data_cfg.field, segmenter, max_bytes, stats, [group])
        except OSError as e:
            log.warning("skipping unreadable row group %d of %s: %s", group, path, e)
            stats.skip("unreadable_file")


def parquet_file_documents(
    path: str, field: str, segmenter: str, max_bytes: int, stats: SkipStats, row_groups=None
):
    import pyarrow.parquet as pq  # noqa: PLC0415

    with paths.path(path).open("rb") as f:
        yield from _parquet_documents_of(pq.ParquetFile(f), field, segmenter, max_bytes, stats, row_groups)


def _parquet_documents_of(parquet, field: str, segmenter: str, max_bytes: int, stats: SkipStats, row_groups):
    if parquet.metadata.num_rows == 0:
        stats.skip("empty_file")
        return
    # One record batch of one column at a time: memory is bounded by the batch, not the file.
    batches = parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, row_groups=row_groups, columns=[field])
    for batch in batches:
        for value in batch.column(0).to_pylist():
            text = record_text(value, max_bytes, stats)
            if text is not None:
                document = document_segments(text, segmenter, stats)
                if document:
                    yield document
