"""What example building takes, gives and counts, shared by builders.py (pairs) and packing.py (rows), and the
registry of builders (`config.data.example_builder`) both register into.

A document is a sequence of int32 arrays, one per segment (a list, or a FlatDocument);
an example is one row's arrays by key (builders.py's docstring lists them).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from bert_jax.registry import Registry
from data_pipelines.sources.prepared import FlatDocument

Document = Sequence[np.ndarray]
Example = dict[str, np.ndarray]

# A builder is a class: Cls(data_cfg, special_ids); `example_keys`, the keys its rows add; `stacker(data_cfg,
# special_ids)`, the function that stacks its examples into a batch (it pickles into grain's workers).
EXAMPLE_BUILDERS: Registry[type] = Registry("config.data.example_builder", "example builders")


@dataclasses.dataclass
class BuildStats:
    """What example building used, skipped and cut; logged by the pipeline."""

    documents: int = 0
    examples: int = 0
    empty_documents: int = 0  # No non-empty segment: nothing to build from.
    single_segment_documents: int = 0  # Pair builders: no boundary between A and B (cut at a token instead).
    too_short_documents: int = 0  # Pair builders: one segment of one token, no pair in it.
    unpaired_segments: int = 0  # A run of one last segment drew a true next it lacks.
    random_next_without_reservoir: int = 0  # NSP: label forced to 0, no other document yet.
    truncated_tokens: int = 0  # Pair builders cut these to fit max_seq_length.
    split_segments: int = 0  # Packing builders: segments longer than a row, split (not cut).

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    def why_no_examples(self, builder: str) -> str:
        """The line a run ends with when `builder` built nothing from all the documents it saw: the documents by
        reason, and the keys that change the outcome."""
        reasons = {"empty": self.empty_documents, "too short (one token)": self.too_short_documents,
                   "one segment": self.single_segment_documents - self.too_short_documents}
        seen = ", ".join(f"{count} {reason}" for reason, count in reasons.items() if count) or "none unusable"
        return (f"config.data.example_builder={builder!r} built no example from {self.documents} document(s) "
                f"({seen}): split documents into more segments with config.data.segmenter "
                "(sentence, blank_line), or pick a packing builder with config.data.example_builder "
                "(full_sentences, doc_sentences, packed)")


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
