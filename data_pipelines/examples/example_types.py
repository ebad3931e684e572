"""What example building takes, gives and counts, shared by builders.py (pairs) and packing.py (rows).

A document is a sequence of int32 arrays, one per segment (a list, or a FlatDocument);
an example is one row's arrays by key (builders.py's docstring lists them).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

Document = Sequence[np.ndarray]
Example = dict[str, np.ndarray]


@dataclasses.dataclass
class BuildStats:
    """What example building used, skipped and cut; logged by the pipeline."""

    documents: int = 0
    examples: int = 0
    empty_documents: int = 0  # No non-empty segment: nothing to build from.
    single_segment_documents: int = 0  # Pair builders: no boundary between A and B.
    unpaired_segments: int = 0  # A run of one last segment drew a true next it lacks.
    random_next_without_reservoir: int = 0  # NSP: label forced to 0, no other document yet.
    truncated_tokens: int = 0  # Pair builders cut these to fit max_seq_length.
    split_segments: int = 0  # Packing builders: segments longer than a row, split (not cut).

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class FlatDocument:
    """A document's segments as one int32 array and the offsets between them: a sequence of
    segments (views) like a list, but built without an array per segment.

    It is what a prepared record holds (records.decode_document), and pair building slices
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


def nonempty_segments(document: Document) -> list[np.ndarray]:
    return [np.asarray(s, np.int32) for s in document if len(s)]


def flat_nonempty(document: Document) -> tuple[np.ndarray, list[int]]:
    """(ids, offsets) of the document's non-empty segments: [0, end of the first, ...], so
    segments i..j-1 are ids[offsets[i]:offsets[j]]. A FlatDocument gives its own array."""
    if isinstance(document, FlatDocument):
        offsets = document.offsets
        if len(set(offsets)) != len(offsets):  # Empty segments repeat an offset.
            offsets = list(dict.fromkeys(offsets))
        return document.ids, offsets
    segments = nonempty_segments(document)
    if not segments:
        return np.zeros(0, np.int32), [0]
    return np.concatenate(segments), [0, *itertools.accumulate(len(s) for s in segments)]
