"""The prepared-corpus format: tokenized documents in ArrayRecord shards, and a manifest.

One record holds one tokenized document (`list[np.ndarray]`, int32 ids per segment):

    uint32 num_segments | uint32 length of each segment | int32 ids of all segments

little-endian, so shards written on one machine read on any other. `manifest.json` in the
output directory lists the shards with their document counts (the order that gives each
document its global index), totals, skipped records by reason and the tokenizer
(`tokenizer/` beside the shards).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from bert_jax.storage import paths

MANIFEST_FILE = "manifest.json"
FORMAT = "bert_jax.prepared.v1"
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


def decode_document(record: bytes) -> list[np.ndarray]:
    """One record's bytes -> [num_tokens] int32 arrays, one per segment.

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
    ends = np.cumsum(lengths).tolist()
    return [ids[start:end] for start, end in zip([0, *ends[:-1]], ends)]


def read_manifest(directory: str) -> dict:
    """The manifest of a prepared directory; names config.data.path when it is not one."""
    path = paths.path(directory) / MANIFEST_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"config.data.path={directory!r} holds no {MANIFEST_FILE}: not a finished "
            "`python -m data_pipelines.prepare` output (run or resume prepare first)"
        )
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


class PreparedDocuments(Sequence):
    """Random access over a prepared directory's shards: item i is tokenized document i.

    Documents are numbered shard by shard in the manifest's order. Reading goes through
    grain's ArrayRecordDataSource, which pickles into worker processes. ArrayRecord reads
    only local files: shards in a bucket are first copied to a local cache (logged,
    see storage.paths.local_copy) and read from there.
    """

    def __init__(self, directory: str):
        import grain  # noqa: PLC0415 (slow import; only readers of shards need it)

        manifest = read_manifest(directory)
        shards = [paths.local_copy(paths.path(directory) / s["path"]) for s in manifest["shards"] if s["documents"]]
        self._source = grain.sources.ArrayRecordDataSource(shards) if shards else []
        self._length = manifest["documents"]
        if len(self._source) != self._length:
            raise ValueError(
                f"{directory}: the shards hold {len(self._source)} records, the manifest says "
                f"{self._length}; the directory is damaged (re-run prepare into a new one)"
            )

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> list[np.ndarray]:
        return decode_document(self._source[index])
