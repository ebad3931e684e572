"""What example building takes, gives and counts, shared by builders.py (pairs) and packing.py (rows).

A document is a list of int32 arrays, one per segment; an example is one row's arrays by
key (builders.py's docstring lists them).
"""

from __future__ import annotations

import dataclasses
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


def nonempty_segments(document: Document) -> list[np.ndarray]:
    return [np.asarray(s, np.int32) for s in document if len(s)]
