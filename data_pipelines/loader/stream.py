"""A checkpointable grain IterDataset of training examples: document feed -> builder.

A *feed* yields this host's documents of one epoch as (position, tokenized document),
in a fixed order given (seed, epoch), and can reopen at any position:

  RandomAccessFeed  embedded / tfds / prepared: the split's document indices, sliced
                    per host, shuffled globally in grain's MapDataset order, reshuffled
                    every epoch. Reopening at a position costs nothing.
  FileOrderFeed     text / jsonl / parquet (file_order.py): this host's files in a seeded
                    order per epoch, several read at once. Reopening at a position takes
                    the cursor the feed recorded there (kept in the state): a resume
                    re-reads only the files that were open.

`ExampleStream` runs a builder (builders.py) over the feed, epoch after epoch, forever.
Its iterator state is small and JSON-able: the epoch, the position of the document whose
examples are being handed out, how many of them were, and the builder's carry before that
document (plus, for NSP, the position its ring of recent documents starts at). Restoring
reopens the feed there, replays the ring, rebuilds that document's examples with the same
rng (derived from seed, epoch, position) and skips those already handed out, so the
continuation is identical. A feed whose opened epoch records cursors (FileOrderFeed) adds the
cursor of the replay's first document to the state.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence

import grain
import numpy as np
from absl import logging

import bert_jax
from data_pipelines import index_shuffle

Document = list[np.ndarray]
Tokenize = Callable[[list[str]], list[np.ndarray]]
TOKENIZE_GROUP = 64  # Documents per encode_ids call: one parallel call in Rust for many.
ORDER_CHUNK = 4096  # Positions of the document order computed at once (bounded memory).
# Skip and build counts reach the log at each epoch's end and, for corpora whose epoch
# outlasts the run, every this many documents.
REPORT_EVERY_DOCUMENTS = 100_000


def _tokenized(raw: Iterator[tuple[int, list]], tokenize: Tokenize | None) -> Iterator[tuple[int, Document]]:
    """Tokenizes (position, segments-as-strings) in groups; passes already-tokenized ones."""
    if tokenize is None:  # Prepared documents: int32 arrays already (records.decode_document).
        yield from raw
        return
    group: list[tuple[int, list]] = []

    def flush():
        flat = [segment for _, document in group for segment in document]
        ids = iter(tokenize(flat) if flat else [])
        for position, document in group:
            yield position, [next(ids) for _ in document]

    for item in raw:
        group.append(item)
        if len(group) >= TOKENIZE_GROUP:
            yield from flush()
            group = []
    yield from flush()


class RandomAccessFeed:
    """This host's share of a random-access split, globally shuffled, new order each epoch.

    Args:
      documents: item i is document i of the source (segments as str, or token arrays).
      indices: the split's document indices (train or held out).
      tokenize: encode_ids, or None when documents are already token ids.
      shuffle_seed: None keeps the source order (eval).
    """

    def __init__(self, documents: Sequence, indices: np.ndarray, tokenize: Tokenize | None,
                 *, shard_index: int, shard_count: int, shuffle_seed: int | None):
        self._documents = documents
        self._indices = np.asarray(indices, np.int64)
        self._tokenize = tokenize
        self._shard = (shard_index, shard_count)
        self._shuffle_seed = shuffle_seed

    def set_slice(self, index: int, count: int) -> None:
        """Narrows the share to its index-th of count parts (grain worker processes)."""
        host, hosts = self._shard
        self._shard = (host + hosts * index, hosts * count)

    def _share(self) -> np.ndarray:
        """This share's document indices, in source order."""
        index, count = self._shard
        share = self._indices[index::count]
        if len(share) == 0:
            raise ValueError(
                f"shard {index} of {count} holds none of the split's {len(self._indices)} documents; "
                "use fewer hosts/workers or a larger corpus"
            )
        return share

    def order(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """The document indices at positions start..stop-1 of the epoch's order.

        grain's order, `MapDataset.source(indices)[i::n].shuffle(seed).repeat(None)`:
        epoch e is the share permuted by index_shuffle with seed (seed + e) mod 2**32,
        computed here a chunk at a time (index_shuffle.py) instead of per document.
        """
        share = self._share()
        positions = np.arange(start, min(stop, len(share)), dtype=np.int64)
        if self._shuffle_seed is None:
            return share[positions]
        seed = (self._shuffle_seed + epoch) % 2**32
        return share[index_shuffle.shuffle_positions(positions, len(share), seed)]

    def open(self, epoch: int, start: int, cursor: dict | None = None) -> Iterator[tuple[int, Document]]:
        del cursor  # Reopening anywhere costs nothing here.
        per_epoch = len(self._share())

        def raw():
            for first in range(start, per_epoch, ORDER_CHUNK):
                chunk = self.order(epoch, first, first + ORDER_CHUNK).tolist()
                for offset, index in enumerate(chunk):
                    yield first + offset, self._documents[index]

        return _tokenized(raw(), self._tokenize)


class ExampleStream(grain.IterDataset):
    """Endless examples of one host: the builder over the feed, epoch after epoch.

    Args:
      feed: a RandomAccessFeed or file_order.FileOrderFeed.
      make_builder: () -> a fresh builder (builders.make_builder).
      seed: this host's seed; document d of epoch e is built with rng (seed, e, d).
      source_stats: the SkipStats the feed's source counts into, reported with the
        builder's counts in the log.
      source: (index, name) of a mixture's source: examples come as (index, epoch, example),
        and the log names the source (mixing.py).
    """

    def __init__(self, feed, make_builder: Callable, seed: int, source_stats=None,
                 source: tuple[int, str] | None = None):
        super().__init__()
        self._feed = feed
        self._make_builder = make_builder
        self._seed = seed
        self._source_stats = source_stats
        self._source = source

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """grain's worker processes each take a slice: every count-th document of the share."""
        del sequential_slice
        self._feed = copy.copy(self._feed)
        self._feed.set_slice(sl.start or 0, sl.step or 1)

    def __iter__(self) -> "ExampleIterator":
        return ExampleIterator(self._feed, self._make_builder(), self._seed, self._source_stats, self._source)

    def __str__(self) -> str:
        return "ExampleStream"


class ExampleIterator(grain.DatasetIterator):
    """Iterator of ExampleStream; see the module docstring for its state."""

    def __init__(self, feed, builder, seed: int, source_stats=None, source: tuple[int, str] | None = None):
        super().__init__()
        self._feed = feed
        self.builder = builder
        self._seed = seed
        self._source_stats = source_stats
        self._source = source
        self._start_epoch(0)

    def _report(self, when: str) -> None:
        source = self._source_stats.log_line() if self._source_stats is not None else "not counted"
        logging.info("training data%s, %s (counts since start): reading the source: %s; "
                     "example building: %s", f" of source {self._source[1]!r}" if self._source else "", when, source,
                     self.builder.stats.as_dict())

    def _start_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        self._documents = self._feed.open(epoch, 0)
        self._documents_this_epoch = 0
        self._examples_this_epoch = 0
        self.builder.reset()
        self._pending: list = []
        self._emitted = 0
        self._position = -1  # Position of the document whose examples are pending.
        self._carry_before = self.builder.carry()
        self._replay_from = 0
        self._replay_cursor = None  # the feed's cursor at _replay_from, where it records cursors

    def _rng(self, position: int) -> np.random.Generator:
        # default_rng([...]) builds exactly this, at twice the cost (once per document).
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence([self._seed, self._epoch, position])))

    def _build(self, position: int, document: Document) -> None:
        self._replay_from = self.builder.ring_start(position)
        if hasattr(self._documents, "cursor_at"):
            self._replay_cursor = self._documents.cursor_at(self._replay_from)
            self._documents.forget_before(self._replay_from)
        self._carry_before = self.builder.carry()
        self._pending = self.builder.add_document(document, self._rng(position), position)
        self._examples_this_epoch += len(self._pending)
        self._position = position
        self._emitted = 0

    def __next__(self) -> dict:
        while self._emitted >= len(self._pending):
            try:
                position, document = next(self._documents)
            except StopIteration:
                if self._documents_this_epoch == 0:
                    raise ValueError(
                        "the source yielded no documents for this host's share of the split; "
                        "check config.data.source/path and the number of hosts"
                    ) from None
                if self._examples_this_epoch == 0:  # another epoch would build nothing either
                    raise bert_jax.UserError(self.builder.stats.why_no_examples(self.builder.name)) from None
                self._report(f"epoch {self._epoch} done ({self._documents_this_epoch} documents)")
                self._start_epoch(self._epoch + 1)
                continue
            self._documents_this_epoch += 1
            if self._documents_this_epoch % REPORT_EVERY_DOCUMENTS == 0:
                self._report(f"epoch {self._epoch}, {self._documents_this_epoch} documents in")
            self._build(position, document)
        example = self._pending[self._emitted]
        self._emitted += 1
        return example if self._source is None else (self._source[0], self._epoch, example)

    def get_state(self) -> dict:
        state = {
            "epoch": self._epoch,
            "position": self._position,
            "emitted": self._emitted,
            "replay_from": self._replay_from,
            "carry": copy.deepcopy(self._carry_before),
        }
        if self._replay_cursor is not None:
            state["cursor"] = copy.deepcopy(self._replay_cursor)
        return state

    def set_state(self, state: dict) -> None:
        self._start_epoch(state["epoch"])
        self.builder.set_carry(state["carry"])
        self._carry_before = self.builder.carry()
        position = state["position"]
        if position < 0:
            return
        self._documents = self._feed.open(self._epoch, state["replay_from"], state.get("cursor"))
        for seen, document in self._documents:
            self._documents_this_epoch += 1
            if seen == position:
                self._build(position, document)
                self._emitted = state["emitted"]
                return
            self.builder.remember(document, seen)
        raise ValueError(f"cannot restore the data iterator: document {position} of epoch "
                         f"{state['epoch']} is no longer in the source (did config.data change?)")
