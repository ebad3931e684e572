"""Sentence-pair examples with next-sentence labels, as in BERT's create_pretraining_data.

From each document, runs of consecutive segments are accumulated up to a target length
(usually max_seq_length - 3; with probability short_seq_prob a shorter random one, so
the model also sees short inputs). A run is split at a random segment boundary into A
and B. With probability nsp_random_prob, B is instead a run of segments from another
document (label 1), and the segments of this document that B would have held are read
again for the next pair. Devlin et al. 2019, §3.1 and Appendix A.2; google-research/bert
create_pretraining_data.py, except for runs of one segment (see `_document_pairs`).

Labels follow Hugging Face: next_sentence_label 0 = B follows A, 1 = B is random.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from data_pipelines.tokenizer import SpecialIds

IS_NEXT = 0
RANDOM_NEXT = 1


@dataclasses.dataclass
class NspStats:
    """What example building used, skipped and cut."""

    documents: int = 0
    empty_documents: int = 0  # No segment, or only empty ones: nothing to build from.
    single_segment_documents: int = 0  # No boundary to split A from a true next B.
    unpaired_segments: int = 0  # A document's last segment, alone, drew a true next.
    examples: int = 0
    random_next: int = 0
    truncated_tokens: int = 0


def _truncate_pair(
    a: list[int], b: list[int], max_tokens: int, rng: np.random.Generator
) -> tuple[list[int], list[int], int]:
    """Cuts tokens from the longer side, from its front or back at random, until it fits.

    Both ends are cut (rather than only the back) so the model does not learn that
    sequences always end at a sentence boundary.
    """
    start_a, end_a, start_b, end_b = 0, len(a), 0, len(b)
    removed = 0
    while (end_a - start_a) + (end_b - start_b) > max_tokens:
        front = rng.random() < 0.5
        if end_a - start_a > end_b - start_b:
            start_a, end_a = (start_a + 1, end_a) if front else (start_a, end_a - 1)
        else:
            start_b, end_b = (start_b + 1, end_b) if front else (start_b, end_b - 1)
        removed += 1
    return a[start_a:end_a], b[start_b:end_b], removed


def _random_b(
    documents: list[list[np.ndarray]], exclude: int, target: int, rng: np.random.Generator
) -> list[int]:
    """Reads segments from a random other document, from a random start, up to target tokens."""
    other = int(rng.integers(len(documents) - 1))
    other += other >= exclude
    segments = documents[other]
    tokens: list[int] = []
    for segment in segments[int(rng.integers(len(segments))) :]:
        tokens.extend(segment.tolist())
        if len(tokens) >= target:
            break
    return tokens


def _draw_target(max_tokens: int, short_seq_prob: float, rng: np.random.Generator) -> int:
    if rng.random() < short_seq_prob:
        return int(rng.integers(2, max_tokens + 1))
    return max_tokens


def _flatten(segments: Sequence[np.ndarray]) -> list[int]:
    return [t for segment in segments for t in segment.tolist()]


def _document_pairs(
    documents: list[list[np.ndarray]],
    index: int,
    max_tokens: int,
    short_seq_prob: float,
    nsp_random_prob: float,
    rng: np.random.Generator,
    stats: NspStats,
):
    """Yields (A tokens, B tokens, label) from documents[index]; max_tokens = A + B cap.

    The label is drawn first, so labels are Bernoulli(nsp_random_prob) exactly (BERT
    forces a random B on a run of one segment, which skews labels on short documents).
    A one-segment run given a true next takes B from the segments after it; if it is
    the document's last segment it has none and is dropped (counted).
    """
    segments = documents[index]
    target = _draw_target(max_tokens, short_seq_prob, rng)
    chunk: list[np.ndarray] = []
    chunk_len = 0
    i = 0
    while i < len(segments):
        chunk.append(segments[i])
        chunk_len += len(segments[i])
        if i == len(segments) - 1 or chunk_len >= target:
            random_next = len(documents) > 1 and rng.random() < nsp_random_prob
            a_end = int(rng.integers(1, len(chunk))) if len(chunk) >= 2 else 1
            a = _flatten(chunk[:a_end])
            if random_next:
                b = _random_b(documents, index, target - len(a), rng)
                i -= len(chunk) - a_end  # Unused segments start the next run.
            elif len(chunk) >= 2:
                b = _flatten(chunk[a_end:])
            elif i + 1 < len(segments):
                b = []
                while i + 1 < len(segments) and len(b) < max(1, target - len(a)):
                    i += 1
                    b.extend(segments[i].tolist())
            else:
                b = []
                stats.unpaired_segments += 1
            if b:
                a, b, removed = _truncate_pair(a, b, max_tokens, rng)
                stats.truncated_tokens += removed
                yield a, b, RANDOM_NEXT if random_next else IS_NEXT
            chunk, chunk_len = [], 0
            target = _draw_target(max_tokens, short_seq_prob, rng)
        i += 1


def build_nsp_examples(
    documents: Sequence[Sequence[np.ndarray]],
    *,
    special_ids: SpecialIds,
    max_seq_length: int,
    short_seq_prob: float,
    nsp_random_prob: float,
    seed: int,
) -> tuple[dict[str, np.ndarray], NspStats]:
    """Builds every sentence-pair example of a tokenized corpus held in memory.

    Args:
      documents: documents, each a list of segments, each an int array of token ids
        (no specials).
      special_ids: [CLS], [SEP] and [PAD] ids.
      max_seq_length: L, the padded length; A + B get at most L - 3 tokens.
      short_seq_prob: chance that a pair aims at a random shorter length.
      nsp_random_prob: chance that B comes from another document.
      seed: the only source of randomness.

    Returns:
      Arrays over N examples: `input_ids` [N, L] int32 = [CLS] A [SEP] B [SEP] [PAD]...,
      `token_type_ids` [N, L] int8 (0 for [CLS] A [SEP], 1 for B [SEP], 0 for padding),
      `next_sentence_label` [N] int32 (0 = B follows A, 1 = B random); and NspStats.
    """
    if max_seq_length < 5:
        raise ValueError(f"max_seq_length={max_seq_length} leaves no room for A and B")
    stats = NspStats()
    usable = []
    for document in documents:
        stats.documents += 1
        segments = [np.asarray(s) for s in document if len(s)]
        if not segments:
            stats.empty_documents += 1
        elif len(segments) == 1:
            stats.single_segment_documents += 1
        else:
            usable.append(segments)

    rng = np.random.default_rng(seed)
    rows, types, labels = [], [], []
    for index in range(len(usable)):
        pairs = _document_pairs(
            usable, index, max_seq_length - 3, short_seq_prob, nsp_random_prob, rng, stats
        )
        for a, b, label in pairs:
            row = [special_ids.cls, *a, special_ids.sep, *b, special_ids.sep]
            rows.append(row)
            types.append(len(a) + 2)  # Where segment B (type 1) starts.
            labels.append(label)

    input_ids = np.full((len(rows), max_seq_length), special_ids.pad, np.int32)
    token_type_ids = np.zeros((len(rows), max_seq_length), np.int8)
    for n, (row, b_start) in enumerate(zip(rows, types)):
        input_ids[n, : len(row)] = row
        token_type_ids[n, b_start : len(row)] = 1
    stats.examples = len(rows)
    stats.random_next = int(sum(labels))
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "next_sentence_label": np.asarray(labels, np.int32),
    }, stats
