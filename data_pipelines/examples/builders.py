"""Documents -> training examples, one document at a time, for each `config.data.example_builder`: a class
registered by that name (example_types.EXAMPLE_BUILDERS; the pair builders here, the packing ones in packing.py).

A builder consumes tokenized documents (a document is a sequence of int32 arrays, one per
segment) and returns the finished examples each one completes; its `stack` turns a list
of them into a batch's rows (the grain batch step calls it through `make_stacker`). It
holds only a bounded buffer: NSP's random B comes from a ring of the `nsp_reservoir_docs` most recent
documents, never from the whole corpus, so any corpus streams through.

  nsp             BERT sentence pairs, B random (label 1) or the true continuation (0)
  sop             ALBERT sentence pairs from one document, swapped (label 1) or in order (0)
  full_sentences  RoBERTa FULL-SENTENCES: contiguous text packed to max_seq_length,
                  across documents with an extra [SEP] between them (packing.py)
  doc_sentences   RoBERTa DOC-SENTENCES: the same, never across a document (packing.py)
  packed          several whole documents per row, segment_ids 1, 2, ... and positions
                  restarting per document, so attention stays in each document (packing.py)

Rows (numpy, after `stack`): input_ids, token_type_ids [n, L] int32 (padding =
special_ids.pad), plus next_sentence_label / sentence_order_label [n] int32, or
segment_ids, position_ids [n, L] int32 for "packed". Pair builders hand out PairExamples
(A and B, not yet rows: a batch of rows is built at once); packing builders hand out
finished rows. Each builder's `example_keys` lists its extra keys; pipeline.batch_spec turns
them into the batch layout.

Exact resume: a builder's `carry()` (what it holds between documents: a partial row, a
few hundred ids at most) is JSON-able and goes into the data iterator's checkpoint;
NSP's ring is instead rebuilt by replaying the `lookback` documents before the resume
point through `remember`.
"""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
from typing import NamedTuple

import numpy as np

from bert_jax.registry import registered_as
from data_pipelines.examples import packing  # noqa: F401 (registers the packing builders)
from data_pipelines.examples.example_types import EXAMPLE_BUILDERS, BuildStats, Document, flat_nonempty
from data_pipelines.tokenizers.tokenizer import SpecialIds

# Labels follow Hugging Face: 0 = B follows A / in order, 1 = random B / swapped.
IS_NEXT, RANDOM_NEXT = 0, 1
IN_ORDER, SWAPPED = 0, 1

def _run_end(offsets: list[int], first: int, tokens: int) -> int:
    """The last segment of the run from segment `first` that holds `tokens` (or the document's last)."""
    return min(bisect.bisect_left(offsets, offsets[first] + tokens, lo=first + 1) - 1, len(offsets) - 2)


def _truncate_pair(a, b, max_tokens: int, rng: np.random.Generator):
    """Cuts tokens from the longer side, front or back at random, until A + B fit.

    Both ends are cut (not only the back) so the model does not learn that inputs
    always end at a sentence boundary (google-research/bert truncate_seq_pair). One
    uniform draw per cut token decides front or back; which side each cut takes is fixed
    by the lengths alone (the longer one, B on a tie: A down to B's length, then B and A
    in turn), so the draws are taken at once and counted per side.
    """
    removed = len(a) + len(b) - max_tokens
    if removed <= 0:
        return a, b, 0
    front = (rng.random(removed) < 0.5).tolist()
    lead = min(removed, abs(len(a) - len(b)))  # Cuts while the sides differ in length.
    # Then B, A, B, ... (equal lengths cut B first).
    a_front, a_count, b_front = sum(front[lead + 1 :: 2]), len(front[lead + 1 :: 2]), sum(front[lead::2])
    if len(a) > len(b):
        a_front, a_count = a_front + sum(front[:lead]), a_count + lead
    else:
        b_front += sum(front[:lead])
    a = a[a_front : len(a) - (a_count - a_front)]
    b = b[b_front : len(b) - (removed - a_count - b_front)]
    return a, b, removed


class PairExample(NamedTuple):
    """A pair before it is a row (stack_pairs makes rows of a batch of them at once)."""

    a: np.ndarray  # Views of the documents' ids: nothing is copied until the row.
    b: np.ndarray
    label: int


class PairBuilder:
    """BERT NSP or ALBERT SOP sentence pairs: [CLS] A [SEP] B [SEP] [PAD]...

    From each document, runs of consecutive segments are accumulated up to a target
    length (max_seq_length - 3, or with probability short_seq_prob a shorter random one)
    and split at a random segment boundary into A and B (Devlin et al. 2019 §3.1,
    Appendix A.2; google-research/bert create_pretraining_data.py).

    NSP: with probability nsp_random_prob B is instead read from a random document of
    the ring of recent ones (label 1), and the segments B would have held start the next
    run. The label is drawn first, so labels are Bernoulli(nsp_random_prob) exactly.
    SOP: B always follows A in the document; with probability 0.5 they are swapped
    (Lan et al. 2020 §4.1).

    A one-segment run takes B from the segments after it; if it is the document's last
    segment it has none and is dropped (counted). A document of one segment (a JSONL record
    with no line break under segmenter="line") is cut at a random token among its first
    target tokens into two pieces that are then paired like two segments: B is its true
    continuation, or (NSP, with nsp_random_prob) a random document's segment as in BERT's
    create_pretraining_data.py: one pair per such document, so such a corpus still trains both
    labels at their rates. One of a single token holds no pair and is counted as too short.
    """

    example_keys: tuple[str, ...]  # (the batch key of the pair's label,)

    def __init__(self, data_cfg, special_ids: SpecialIds, random_prob: float = 0.0, lookback: int = 0):
        if data_cfg.max_seq_length < 5:
            raise ValueError(
                f"config.data.max_seq_length={data_cfg.max_seq_length} leaves no room for A and B"
            )
        self.special_ids = special_ids
        self.max_seq_length = data_cfg.max_seq_length
        self.short_seq_prob = data_cfg.short_seq_prob
        self.random_prob = random_prob
        self.lookback = lookback
        self._ring: collections.deque = collections.deque(maxlen=max(1, self.lookback))
        self.stats = BuildStats()

    @classmethod
    def stacker(cls, data_cfg, special_ids: SpecialIds):
        """The function that stacks this builder's examples into rows; it pickles into grain's workers."""
        return functools.partial(stack_pairs, special_ids=special_ids, max_seq_length=data_cfg.max_seq_length,
                                 label_key=cls.example_keys[0])

    def _label(self, a: np.ndarray, b: np.ndarray, random_next: bool, rng: np.random.Generator):
        """(A, B, label) of a pair whose B followed A (or, random_next, came from another document): NSP's and SOP's
        own rule, defined by each registered pair builder (abstract)."""
        raise NotImplementedError

    def carry(self) -> dict:
        return {}

    def set_carry(self, carry: dict) -> None:
        del carry

    def reset(self) -> None:
        """Forgets the ring (at each epoch start, so a resumed epoch replays the same ring)."""
        self._ring.clear()

    def remember(self, document: Document, position: int) -> None:
        """Adds a document to the ring without building from it (replay on resume)."""
        self._remember(position, *flat_nonempty(document))

    def _remember(self, position: int, ids: np.ndarray, offsets: list[int]) -> None:
        if self.lookback and len(offsets) > 1:
            self._ring.append((position, ids, offsets))

    def ring_start(self, position: int) -> int:
        """Where a replay must start to rebuild the ring as it is before `position`."""
        return self._ring[0][0] if self._ring else position

    def finish(self) -> list[PairExample]:
        return []

    def _target(self, rng: np.random.Generator) -> int:
        max_tokens = self.max_seq_length - 3
        if rng.random() < self.short_seq_prob:
            return int(rng.integers(2, max_tokens + 1))
        return max_tokens

    def _random_b(self, target: int, rng: np.random.Generator) -> np.ndarray:
        """Segments of a random ring document, from a random start, up to target tokens."""
        _, ids, offsets = self._ring[int(rng.integers(len(self._ring)))]
        first = int(rng.integers(len(offsets) - 1))
        return ids[offsets[first] : offsets[_run_end(offsets, first, target) + 1]]

    def add_document(self, document: Document, rng: np.random.Generator, position: int = 0) -> list[PairExample]:
        """The examples of one document (rows once stacked); `position` (its place in the feed) tags the ring."""
        self.stats.documents += 1
        ids, offsets = flat_nonempty(document)
        if len(offsets) == 1:
            self.stats.empty_documents += 1
            return []
        if len(offsets) == 2:
            self.stats.single_segment_documents += 1
            if len(ids) < 2:
                self.stats.too_short_documents += 1
                self._remember(position, ids, offsets)
                return []
            # A random cut within the first target tokens: A is its head, B what follows (or a random B). One
            # pair: a second from the head's leftover would be a random B only, skewing the labels.
            cut = [0, int(rng.integers(1, min(len(ids), self.max_seq_length - 3))), len(ids)]
            examples = list(itertools.islice(self._pairs(ids, cut, rng), 1))
        else:
            examples = list(self._pairs(ids, offsets, rng))
        self._remember(position, ids, offsets)  # uncut, as `remember` rebuilds it on resume
        self.stats.examples += len(examples)
        return examples

    def _pairs(self, ids: np.ndarray, offsets: list[int], rng: np.random.Generator):
        """Runs of segments split into A and B, each a slice of the document's ids: segments
        i..j-1 are ids[offsets[i]:offsets[j]], and run ends are found on the offsets."""
        max_tokens = self.max_seq_length - 3
        last = len(offsets) - 2
        target = self._target(rng)
        i = 0
        while i <= last:
            end = _run_end(offsets, i, target)  # The run is segments i..end.
            run = end - i + 1
            random_next = rng.random() < self.random_prob
            if random_next and not self._ring:
                random_next = False
                self.stats.random_next_without_reservoir += 1
            a_end = int(rng.integers(1, run)) if run >= 2 else 1
            a = ids[offsets[i] : offsets[i + a_end]]
            b = None
            if random_next:
                b = self._random_b(max(1, target - len(a)), rng)
                end = i + a_end - 1  # Unused segments start the next run.
            elif run >= 2:
                b = ids[offsets[i + a_end] : offsets[end + 1]]
            elif end < last:
                following = _run_end(offsets, end + 1, max(1, target - len(a)))
                b = ids[offsets[end + 1] : offsets[following + 1]]
                end = following
            else:
                self.stats.unpaired_segments += 1
            if b is not None:
                a, b, removed = _truncate_pair(a, b, max_tokens, rng)
                self.stats.truncated_tokens += removed
                yield PairExample(*self._label(a, b, random_next, rng))
            target = self._target(rng)
            i = end + 1

    def stack(self, examples: list[PairExample]) -> dict[str, np.ndarray]:
        return stack_pairs(examples, special_ids=self.special_ids, max_seq_length=self.max_seq_length,
                           label_key=self.example_keys[0])


@registered_as(EXAMPLE_BUILDERS, "nsp")
class NextSentenceBuilder(PairBuilder):
    """BERT's next-sentence pairs: B random (label 1) or the true continuation (0)."""

    example_keys = ("next_sentence_label",)

    def __init__(self, data_cfg, special_ids: SpecialIds):
        super().__init__(data_cfg, special_ids, data_cfg.nsp_random_prob, data_cfg.nsp_reservoir_docs)

    def _label(self, a, b, random_next, rng):
        return a, b, RANDOM_NEXT if random_next else IS_NEXT


@registered_as(EXAMPLE_BUILDERS, "sop")
class SentenceOrderBuilder(PairBuilder):
    """ALBERT's sentence-order pairs from one document: swapped (label 1) or in order (0)."""

    example_keys = ("sentence_order_label",)

    def _label(self, a, b, random_next, rng):
        del random_next  # SOP never draws a random B.
        return (b, a, SWAPPED) if rng.random() < 0.5 else (a, b, IN_ORDER)


def stack_pairs(examples: list[PairExample], special_ids: SpecialIds, max_seq_length: int,
                label_key: str) -> dict[str, np.ndarray]:
    """Pairs -> rows [CLS] A [SEP] B [SEP] [PAD]..., a whole batch in a few array operations.

    A row at a time cost more than the rest of building a pair; here every A and B is
    copied into place by one scatter. Returns input_ids, token_type_ids [n, L] int32
    (type 1 from B to its [SEP]) and the label [n] int32.
    """
    n, length, sp = len(examples), max_seq_length, special_ids
    a_len = np.fromiter((len(e.a) for e in examples), np.int64, n)
    b_len = np.fromiter((len(e.b) for e in examples), np.int64, n)
    input_ids = np.full((n, length), sp.pad, np.int32)
    if n:
        pieces = [piece for e in examples for piece in (e.a, e.b)]  # A0, B0, A1, B1, ...
        piece_len = np.stack([a_len, b_len], axis=1).ravel()
        first_column = np.stack([np.ones(n, np.int64), a_len + 2], axis=1).ravel()
        piece_start = np.cumsum(piece_len) - piece_len  # Where each piece starts in `tokens`.
        tokens = np.concatenate(pieces)
        rows = np.repeat(np.arange(n), a_len + b_len)
        columns = np.arange(len(tokens)) + np.repeat(first_column - piece_start, piece_len)
        input_ids[rows, columns] = tokens
        rows = np.arange(n)
        input_ids[:, 0] = sp.cls
        input_ids[rows, a_len + 1] = sp.sep
        input_ids[rows, a_len + b_len + 2] = sp.sep
    column = np.arange(length)
    token_type_ids = ((column >= (a_len + 2)[:, None]) & (column < (a_len + b_len + 3)[:, None])).astype(np.int32)
    labels = np.fromiter((e.label for e in examples), np.int32, n)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, label_key: labels}


def builder_class(data_cfg) -> type:
    """The class `config.data.example_builder` names; `bert_jax.UserError` naming the key otherwise."""
    return EXAMPLE_BUILDERS.get(data_cfg.example_builder)


def example_keys(data_cfg) -> tuple[str, ...]:
    """The keys this builder's rows add to input_ids and token_type_ids (pipeline.batch_spec lays them out)."""
    return builder_class(data_cfg).example_keys


def make_stacker(data_cfg, special_ids: SpecialIds):
    """The function that stacks this builder's examples into rows; it pickles into grain's workers."""
    return builder_class(data_cfg).stacker(data_cfg, special_ids)


def make_builder(data_cfg, special_ids: SpecialIds):
    """The builder `config.data.example_builder` names, over config.data."""
    return builder_class(data_cfg)(data_cfg, special_ids)
