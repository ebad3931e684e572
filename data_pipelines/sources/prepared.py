"""The prepared-corpus format: tokenized documents in ArrayRecord shards, and a manifest.

`prepare` (data_pipelines/shards/) writes it; the `prepared` source reads it back, so it lives with the sources,
below every stage that touches it.

One record holds one tokenized document (its segments of int32 ids; decoded as a FlatDocument):

    uint32 num_segments | uint32 length of each segment | int32 ids of all segments

little-endian, so shards written on one machine read on any other. `manifest.json` in the
output directory lists the shards with their document counts (the order that gives each
document its global index), their sizes in bytes and CRC-32s, totals, skipped records by reason and
the tokenizer (`tokenizer/` beside the shards).

A damaged shard stops the run, named in one line (docs/guides/data.md, "Damaged shards"): a missing one, or one
whose size is not the manifest's (a truncated copy), when the config is checked, before anything is written
(`check_shards`); one whose bytes changed at the same size (a flipped byte) when it is first opened, by its CRC-32,
before any of its records is read (for a bucket: its local copy, which is then deleted); a record that does not
decode, and a shard gone from a bucket mid-run, when read. A manifest written before sizes and CRCs were kept is
checked by document counts alone, as before.

Only damage is named damage: a storage fault on the way (a bucket's dropped connection, a timeout) is retried
(bert_jax/storage/retry.py) and then raised with its cause, and any other error (a MemoryError) passes through as
it is, since preparing again would mend none of them.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import zlib
from collections.abc import Sequence

import numpy as np

from bert_jax.storage import paths
from bert_jax.storage.retry import retried

MANIFEST_FILE = "manifest.json"
FORMAT = "bert_jax.prepared.v1"
# What the manifest says of each shard.
SHARD_KEYS = ("path", "documents", "segments", "tokens", "bytes", "crc32")
_CHUNK = 1 << 22
_U32 = np.dtype("<u4")
_I32 = np.dtype("<i4")


def encode_document(segments: Sequence[np.ndarray]) -> bytes:
    """A tokenized document (int ids per segment) -> one record's bytes."""
    lengths = np.array([len(s) for s in segments], _U32)
    ids = np.concatenate([np.asarray(s) for s in segments]) if segments else np.zeros(0)
    if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
        raise ValueError("token ids must be in [0, 2**31): cannot encode the document")
    header = np.array([len(segments)], _U32)
    return header.tobytes() + lengths.tobytes() + ids.astype(_I32).tobytes()


def decode_document(record: bytes) -> FlatDocument:
    """One record's bytes -> its segments, [num_tokens] int32 arrays (views of one array).

    Raises ValueError if the record's sizes disagree (a corrupt or foreign record).
    """
    buffer = memoryview(record)
    if len(buffer) < 4:
        raise ValueError(f"record of {len(buffer)} bytes is too short for a document header")
    (count,) = np.frombuffer(buffer[:4], _U32)
    header_bytes = 4 + 4 * int(count)
    if len(buffer) < header_bytes:
        raise ValueError(f"record declares {count} segments but has only {len(buffer)} bytes")
    lengths = np.frombuffer(buffer[4:header_bytes], _U32).astype(np.int64)
    if len(buffer) != header_bytes + 4 * int(lengths.sum()):
        raise ValueError(
            f"record holds {len(buffer) - header_bytes} id bytes; its lengths say {4 * int(lengths.sum())}"
        )
    ids = np.frombuffer(buffer[header_bytes:], _I32).astype(np.int32)
    return FlatDocument(ids, [0, *np.cumsum(lengths).tolist()])


def read_manifest(directory: str) -> dict:
    """The manifest of a prepared directory; names config.data.path when it is not one."""
    path = paths.path(directory) / MANIFEST_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"config.data.path={directory!r} holds no {MANIFEST_FILE}: not a finished "
            "`python -m bert_jax.commands.prepare` output (run or resume prepare first)"
        )
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def file_crc32(path) -> str:
    """The CRC-32 of a file's bytes, 8 hex digits (zlib's: a gigabyte a second or more, read once)."""
    crc = 0
    with paths.path(path).open("rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


class DamagedShardError(ValueError):
    """A prepared shard is missing, or its bytes are not those `prepare` wrote. Its message is one line."""


def _damaged(directory: str, name: str, what: str) -> DamagedShardError:
    return DamagedShardError(f"config.data.path={directory!r}: shard {name} {what}; the prepared corpus is damaged: "
                             f"restore the file, or prepare again into a new folder")


def _unreadable(error: RuntimeError) -> bool:
    """ArrayRecord's error for bytes that are not a records file (a hash mismatch, a bad header, a cut-off block):
    a RuntimeError from its Riegeli reader, which raises its other faults (an I/O error) as RuntimeErrors too."""
    return "Riegeli/records file" in str(error)


# Prepared folders whose shard sizes this process checked (a config check, then the loader, check once).
_SIZES_CHECKED: set[str] = set()
# Local shard files whose CRC this process checked, by (path, size, mtime): the train and eval feeds open the same.
_CRC_CHECKED: set[tuple[str, int, int]] = set()


def check_shards(directory: str) -> None:
    """Every shard the manifest lists exists at the size it gives (a stat each; a bucket's too); DamagedShardError
    naming the first that does not. Once per folder and process."""
    if directory in _SIZES_CHECKED:
        return
    for shard in read_manifest(directory)["shards"]:
        file = paths.path(directory) / shard["path"]
        if not file.exists():
            raise _damaged(directory, shard["path"], "is missing")
        size = file.stat().length
        if "bytes" in shard and size != shard["bytes"]:
            raise _damaged(directory, shard["path"], f"is {size} bytes, the manifest says {shard['bytes']} "
                                                     f"(truncated, or another file)")
    _SIZES_CHECKED.add(directory)


class FlatDocument:
    """A document's segments as one int32 array and the offsets between them: a sequence of
    segments (views) like a list, but built without an array per segment.

    It is what a prepared record holds (decode_document), and pair building slices
    a run of segments out of it instead of joining them again (`flat_nonempty`).
    """

    __slots__ = ("ids", "offsets")

    def __init__(self, ids: np.ndarray, offsets: list[int]):
        self.ids = ids
        self.offsets = offsets  # [0, end of segment 0, end of segment 1, ...]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"segment {index} of {len(self)}")
        return self.ids[self.offsets[index] : self.offsets[index + 1]]

    def __iter__(self):
        offsets = self.offsets
        return (self.ids[start:stop] for start, stop in zip(offsets[:-1], offsets[1:]))


class PreparedDocuments(Sequence):
    """Random access over a prepared directory's shards: item i is tokenized document i.

    Documents are numbered shard by shard in the manifest's order; `shard_ranges` gives
    each shard's [start, stop). Shards are opened on first use through grain's
    ArrayRecordDataSource, and the object pickles into worker processes (without its open
    readers). ArrayRecord reads only local files: a shard in a bucket is copied to the
    local cache (storage.paths.local_copy) when a document of it is first read, so a host
    copies only the shards it reads, and the cache stays within `cache_bytes` (0 = no
    bound) by evicting the least recently used files that no reader holds.
    """

    def __init__(self, directory: str, cache_bytes: int = 0):
        manifest = read_manifest(directory)
        self._directory = directory
        self._cache_bytes = cache_bytes
        shards = [s for s in manifest["shards"] if s["documents"]]
        self._paths = [s["path"] for s in shards]
        self._crc32 = [s.get("crc32") for s in shards]
        self._verified: set[int] = set()  # shards whose CRC this object (and the workers it is pickled into) checked
        self._counts = [s["documents"] for s in shards]
        self._starts = [0, *itertools.accumulate(self._counts)]
        self._length = manifest["documents"]
        if self._starts[-1] != self._length:
            raise ValueError(
                f"{directory}: the manifest's shards list {self._starts[-1]} documents, its total says "
                f"{self._length}; the directory is damaged (re-run prepare into a new one)"
            )
        self._readers: dict = {}
        if not paths.is_remote(directory):
            for shard in range(len(self._paths)):  # Local shards are checked now.
                self._reader(shard)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_readers": {}}

    def __len__(self) -> int:
        return self._length

    def shard_ranges(self) -> list[tuple[int, int]]:
        """[start, stop) of each non-empty shard's documents."""
        return list(zip(self._starts[:-1], self._starts[1:]))

    def _reader(self, shard: int):
        reader = self._readers.get(shard)
        if reader is None:
            import grain  # noqa: PLC0415 (slow import; only readers of shards need it)

            in_use = [local for local, _ in self._readers.values()]
            name = self._paths[shard]
            try:
                local = retried(lambda: paths.local_copy(paths.path(self._directory) / name, self._cache_bytes, in_use),
                                f"reading shard {name} of {self._directory}")
            except FileNotFoundError:
                raise _damaged(self._directory, name, "is gone (the manifest lists it)") from None
            self._verify(shard, local)
            try:
                reader = (local, grain.sources.ArrayRecordDataSource([local]))
            except RuntimeError as error:
                if not _unreadable(error):
                    raise
                raise _damaged(self._directory, name, f"is not a records file ({error})") from None
            if len(reader[1]) != self._counts[shard]:
                raise _damaged(self._directory, name, f"holds {len(reader[1])} records, the manifest says "
                                                      f"{self._counts[shard]}")
            self._readers[shard] = reader
        return reader[1]

    def _verify(self, shard: int, local: str) -> None:
        """The shard's CRC-32 against the manifest's, once: a flipped byte keeps the size. A bad copy from a bucket
        is deleted, so that the next read downloads it again."""
        want = self._crc32[shard]
        stat = os.stat(local)  # (a local file: the reader's own copy)
        key = (local, stat.st_size, stat.st_mtime_ns)
        if want is None or shard in self._verified or key in _CRC_CHECKED:
            return
        have = file_crc32(local)
        if have != want:
            if paths.is_remote(self._directory):
                paths.path(local).unlink(missing_ok=True)
            raise _damaged(self._directory, self._paths[shard], f"has CRC-32 {have}, the manifest says {want} "
                                                                f"(its bytes changed)")
        self._verified.add(shard)
        _CRC_CHECKED.add(key)

    def __getitem__(self, index: int) -> FlatDocument:
        if not 0 <= index < self._length:
            raise IndexError(f"document {index} of {self._length}")
        shard = bisect.bisect_right(self._starts, index) - 1
        record = index - self._starts[shard]
        reader = self._reader(shard)
        try:
            data = reader[record]
        except RuntimeError as error:
            if not _unreadable(error):
                raise
            raise _damaged(self._directory, self._paths[shard], f"record {record} cannot be read ({error})") from None
        try:
            return decode_document(data)
        except ValueError as error:  # the record's sizes disagree: a foreign or corrupt record
            raise _damaged(self._directory, self._paths[shard], f"record {record} does not decode ({error})") from None
