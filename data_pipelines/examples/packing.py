"""Rows filled with contiguous text: RoBERTa FULL-/DOC-SENTENCES and document-aware packing.

  full_sentences  [CLS] s1 s2 ... [SEP]: whole segments in order until the next would not
                  fit in max_seq_length; a document's end adds an extra [SEP] and the row
                  goes on into the next document (Liu et al. 2019 §4.2).
  doc_sentences   the same, but a row ends with its document (rows near a document's end
                  are shorter; the paper grows the batch instead, we pad).
  packed          each document (or piece of one) is its own sequence [CLS] doc [SEP];
                  sequences are packed into a row while they fit, with segment_ids
                  1, 2, 3, ... per sequence (0 on padding) and position_ids restarting at
                  0, so the model's block-diagonal attention keeps each one to itself
                  (the flax lm1b example's packing, kept document-aware).

A segment (or, for "packed", a document) longer than a row is split into row-sized
pieces in order: nothing is dropped, and each split is counted. Packing is greedy and
sequential (next-fit), so the only state between documents is the row being filled.
"""

from __future__ import annotations

import numpy as np

from bert_jax.registry import registered_as
from data_pipelines.examples.example_types import EXAMPLE_BUILDERS, BuildStats, Document, Example, nonempty_segments
from data_pipelines.tokenizers.tokenizer import SpecialIds


def _pieces(tokens: np.ndarray, size: int) -> list[np.ndarray]:
    return [tokens[i : i + size] for i in range(0, len(tokens), size)]


def stack_rows(examples: list[Example]) -> dict[str, np.ndarray]:
    """Finished rows -> [n, ...] arrays by key."""
    return {key: np.stack([row[key] for row in examples]) for key in examples[0]}


class PackingBuilder:
    """Rows of config.data.max_seq_length tokens filled with contiguous text; subclasses say how a document fills
    them (`_add`) and what a finished row holds (`_emit`)."""

    lookback = 0  # Nothing to replay on resume: the partial row is the carry.
    example_keys: tuple[str, ...] = ()

    def __init__(self, data_cfg, special_ids: SpecialIds):
        if data_cfg.max_seq_length < 3:
            raise ValueError(f"config.data.max_seq_length={data_cfg.max_seq_length} holds no text")
        self.special_ids = special_ids
        self.max_seq_length = data_cfg.max_seq_length
        self.capacity = data_cfg.max_seq_length - 2  # Room for text between [CLS] and [SEP].
        self.stats = BuildStats()
        self._row: list = []

    @classmethod
    def stacker(cls, data_cfg, special_ids: SpecialIds):
        del data_cfg, special_ids  # Rows are finished already.
        return stack_rows

    def carry(self) -> dict:
        return {"row": [int(t) for t in self._row]}

    def set_carry(self, carry: dict) -> None:
        self._row = list(carry["row"]) if carry else []

    def reset(self) -> None:
        """Nothing to forget at an epoch start: the partial row carries on."""

    def remember(self, document: Document, position: int) -> None:
        del document, position

    def ring_start(self, position: int) -> int:
        return position

    def add_document(self, document: Document, rng: np.random.Generator, position: int = 0) -> list[Example]:
        del rng, position  # Packing is deterministic.
        self.stats.documents += 1
        segments = nonempty_segments(document)
        if not segments:
            self.stats.empty_documents += 1
            return []
        examples = self._add(segments)
        self.stats.examples += len(examples)
        return examples

    def stack(self, examples: list[Example]) -> dict[str, np.ndarray]:
        return stack_rows(examples)

    def finish(self) -> list[Example]:
        """The last partial row, at the end of a finite stream (eval)."""
        examples = [self._emit()] if self._row else []
        self.stats.examples += len(examples)
        return examples

    def _add(self, segments: list[np.ndarray]) -> list[Example]:
        """The rows one document's segments complete: each registered packing builder's own rule (abstract)."""
        raise NotImplementedError

    def _emit(self) -> Example:
        """The row being filled, closed as an example: each registered packing builder's own rule (abstract)."""
        raise NotImplementedError


@registered_as(EXAMPLE_BUILDERS, "full_sentences")
class FullSentencesBuilder(PackingBuilder):
    """RoBERTa FULL-SENTENCES: whole segments in order across documents, an extra [SEP] at a document's end."""

    ends_row_with_document = False

    def _add(self, segments: list[np.ndarray]) -> list[Example]:
        examples = []
        for segment in segments:
            pieces = _pieces(segment, self.capacity)
            self.stats.split_segments += len(pieces) - 1
            for piece in pieces:
                if len(self._row) + len(piece) > self.capacity:
                    examples.append(self._emit())
                self._row.extend(piece.tolist())
        if self.ends_row_with_document:
            examples.append(self._emit())
        elif self._row and len(self._row) < self.capacity:
            self._row.append(self.special_ids.sep)  # The extra separator between documents.
        return examples

    def _emit(self) -> Example:
        sp, length = self.special_ids, self.max_seq_length
        input_ids = np.full(length, sp.pad, np.int32)
        input_ids[: len(self._row) + 2] = [sp.cls, *self._row, sp.sep]
        self._row = []
        return {"input_ids": input_ids, "token_type_ids": np.zeros(length, np.int32)}


@registered_as(EXAMPLE_BUILDERS, "doc_sentences")
class DocSentencesBuilder(FullSentencesBuilder):
    """RoBERTa DOC-SENTENCES: the same, but a row ends with its document."""

    ends_row_with_document = True


@registered_as(EXAMPLE_BUILDERS, "packed")
class PackedBuilder(PackingBuilder):
    """Whole documents (or row-sized pieces of one) as sequences [CLS] doc [SEP], packed into a row while they fit,
    with segment_ids 1, 2, ... and position_ids restarting per sequence. The row is a list of sequences."""

    example_keys = ("segment_ids", "position_ids")

    def carry(self) -> dict:
        return {"row": [[int(t) for t in sequence] for sequence in self._row]}

    def _add(self, segments: list[np.ndarray]) -> list[Example]:
        examples = []
        pieces = _pieces(np.concatenate(segments), self.capacity)
        self.stats.split_segments += len(pieces) - 1
        for piece in pieces:
            used = sum(len(p) + 2 for p in self._row)
            if used + len(piece) + 2 > self.max_seq_length:
                examples.append(self._emit())
            self._row.append(piece.tolist())
        return examples

    def _emit(self) -> Example:
        sp, length = self.special_ids, self.max_seq_length
        input_ids = np.full(length, sp.pad, np.int32)
        segment_ids = np.zeros(length, np.int32)
        position_ids = np.zeros(length, np.int32)
        start = 0
        for number, sequence in enumerate(self._row, start=1):
            end = start + len(sequence) + 2
            input_ids[start:end] = [sp.cls, *sequence, sp.sep]
            segment_ids[start:end] = number
            position_ids[start:end] = np.arange(end - start)
            start = end
        self._row = []
        return {"input_ids": input_ids, "token_type_ids": np.zeros(length, np.int32),
                "segment_ids": segment_ids, "position_ids": position_ids}
