"""Mixing the sources of a data mixture (sources/mixture.py): one example stream per source, by weight.

  constant weights   grain's `IterDataset.mix` over the sources' streams (keyed by name): a
                     deterministic interleave that holds each source's count within one
                     example of its weight's share at every point, its state the sources'
                     states and the position, so a resume is exact.
  a schedule         ScheduledMixIterDataset: the same kind of interleave (a source is drawn
                     when it is furthest behind its share), its weights those of the stage
                     that holds the example's batch; it restarts the shares at each stage.

Each example travels as (source index, epoch, example), the index its source's place in
mixture.source_names and the epoch that of its source's stream (the source's
stream.ExampleStream tags it), until the batch is stacked (SourceStacker: `source_ids`,
`source_epochs [B] int32`); the trainer's iterator (SourceCountingIterator) takes them out of
the batch and counts sequences, tokens and epochs per source, cumulatively, in its
checkpointed state. It also ends the data: the first batch holding a second epoch's example
of a source that stops (on_exhausted="stop") is not handed out, and the iterator ends there,
for good. Deciding in the trainer's process, from the tags, keeps it the same with or without
grain's worker processes and makes the end part of the resumable state. Nothing here is random: the order is a function of the weights and
the per-host batch size, and each source's own stream draws from the seed as a single source does.
"""

from __future__ import annotations

from collections.abc import Sequence

import grain
import numpy as np

SOURCE_IDS = "source_ids"  # per batch row [B] int32, until the trainer's iterator counts it
SOURCE_EPOCHS = "source_epochs"  # per batch row [B] int32: the epoch of the row's source it came from
TAG_KEYS = (SOURCE_IDS, SOURCE_EPOCHS)


class SourceStacker:
    """A builder's stacker (builders.make_stacker) over (source index, epoch, example): adds TAG_KEYS."""

    def __init__(self, stack):
        self._stack = stack

    def __call__(self, tagged: Sequence[tuple]) -> dict[str, np.ndarray]:
        batch = self._stack([example for _, _, example in tagged])
        batch[SOURCE_IDS] = np.array([index for index, _, _ in tagged], np.int32)
        batch[SOURCE_EPOCHS] = np.array([epoch for _, epoch, _ in tagged], np.int32)
        return batch


ORDER_CHUNK = 4096  # positions of a stage's source order computed at once


def grain_proportions(weights: Sequence[float]) -> tuple[int, ...]:
    """grain's integer proportions of the positive weights: the smallest scaled to 100, each truncated."""
    scale = 100 / min(w for w in weights if w > 0)
    return tuple(int(w * scale) for w in weights if w > 0)


def interleave_order(positions: np.ndarray, proportions: Sequence[int]) -> np.ndarray:
    """The source (an index into proportions) of each position of grain's `IterDataset.mix` order.

    grain's rule (mix.py, _dataset_and_key_of_next_element), vectorised: source i gives the
    element at position k where its running count, floor-scaled, steps up; the order repeats
    every sum(proportions) positions and holds each source within one element of its share.
    """
    total = sum(proportions)
    k = np.asarray(positions, np.int64) % total
    k1 = k + 1
    out = np.full(len(k), len(proportions) - 1, np.int64)
    undecided = np.ones(len(k), bool)
    remaining = total
    for i, p in enumerate(proportions[:-1]):
        next_k, next_k1 = k * (remaining - p) // remaining, k1 * (remaining - p) // remaining
        hit = undecided & ((k - next_k) != (k1 - next_k1))
        out[hit] = i
        undecided &= ~hit
        remaining -= p
        k, k1 = next_k, next_k1
    return out


class MixIterDataset(grain.IterDataset):
    """Examples of the sources' streams, in grain's mix order for the weights of each example's stage.

    One stage draws exactly as grain's `IterDataset.mix` does, at a fraction of its cost per
    example: the order is computed ORDER_CHUNK positions at a time with numpy (interleave_order)
    and `__next__` only looks it up, where grain's mix computes it per element under its
    statistics and tracing wrappers (0.85x a single source's speed, bench/mixture_throughput.py).
    With a schedule, the stage is that of the example's batch, and a stage's order starts afresh
    at its first example.

    Args:
      parents: one example stream per source (stream.ExampleStream, its examples tagged), in
        source_names order.
      schedule: mixture.stages(config.data): ((first batch index, weights), ...).
      batch_size: examples per batch of this host (the stage of example i is that of batch
        first_step + i // batch_size).
      first_step: the run's step before the first batch (a staged run's stage starts later).
    """

    def __init__(self, parents: Sequence[grain.IterDataset], schedule, batch_size: int, first_step: int = 0):
        super().__init__(list(parents))
        self._schedule = tuple(schedule)
        self._batch_size = batch_size
        self._first_step = first_step
        self._slice = (0, 1)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """grain's worker w of n makes this host's batches w, w + n, ...: each source's stream is sliced too."""
        self._slice = (sl.start or 0, sl.step or 1)
        for parent in self._parents:
            parent.set_slice(sl, sequential_slice)

    def __iter__(self) -> "_MixIterator":
        return _MixIterator([p.__iter__() for p in self._parents], self._schedule,
                            self._batch_size, self._slice, self._first_step)

    def __str__(self) -> str:
        return f"MixIterDataset({len(self._parents)} sources, {len(self._schedule)} stages)"


class _MixIterator(grain.DatasetIterator):

    def __init__(self, parents, schedule, batch_size: int, worker_slice: tuple[int, int], first_step: int):
        super().__init__(parents)
        self._schedule, self._batch_size, self._worker_slice = schedule, batch_size, worker_slice
        self._first_step = first_step
        self._index = 0  # examples handed out by this iterator
        self._stage, self._stage_start = -1, 0  # the stage and the index of its first example
        self._enter_stage()

    def _stage_of(self, index: int) -> int:
        worker, workers = self._worker_slice
        batch = self._first_step + (index // self._batch_size) * workers + worker  # the run's batch index
        stage = max(self._stage, 0)
        while stage + 1 < len(self._schedule) and batch >= self._schedule[stage + 1][0]:
            stage += 1  # batches only grow: the stage only moves forward
        return stage

    def _enter_stage(self) -> None:
        """Moves to the stage of the next example (a new stage starts its order there)."""
        stage = self._stage_of(self._index)
        if stage != self._stage:
            self._stage, self._stage_start = stage, self._index
        weights = self._schedule[self._stage][1]
        self._sources = np.flatnonzero(np.asarray(weights) > 0)
        self._proportions = grain_proportions(weights)
        self._chunk_start, self._chunk = 0, []
        self._next_check = self._index + self._batch_size - self._index % self._batch_size

    def __next__(self) -> tuple:
        if self._index >= self._next_check:  # a new batch: perhaps a new stage
            self._next_check = self._index + self._batch_size
            if len(self._schedule) > 1 and self._stage_of(self._index) != self._stage:
                self._enter_stage()
        position = self._index - self._stage_start
        offset = position - self._chunk_start
        if not 0 <= offset < len(self._chunk):
            self._chunk_start, offset = position, 0
            order = interleave_order(np.arange(position, position + ORDER_CHUNK), self._proportions)
            self._chunk = self._sources[order].tolist()
        tagged = next(self._parents[self._chunk[offset]])
        self._index += 1
        return tagged

    def get_state(self) -> dict:
        return {"parents": [p.get_state() for p in self._parents], "index": self._index,
                "stage": self._stage, "stage_start": self._stage_start}

    def set_state(self, state: dict) -> None:
        for parent, parent_state in zip(self._parents, state["parents"]):
            parent.set_state(parent_state)
        self._index, self._stage, self._stage_start = state["index"], state["stage"], state["stage_start"]
        self._enter_stage()


def mix_sources(streams: dict[str, grain.IterDataset], schedule, batch_size: int,
                first_step: int = 0) -> grain.IterDataset:
    """The sources' tagged example streams (name -> stream, names sorted) as one (MixIterDataset).

    schedule: mixture.stages(config.data); a single stage with a single source of positive
    weight is that source's stream.
    """
    if len(schedule) == 1 and sum(w > 0 for w in schedule[0][1]) == 1:
        return list(streams.values())[int(np.argmax(schedule[0][1]))]
    return MixIterDataset(list(streams.values()), schedule, batch_size, first_step)


class SourceCountingIterator(grain.DatasetIterator):
    """The trainer's batch iterator of a mixture: takes TAG_KEYS out of each batch, counts, and ends the data.

    Cumulative per source: sequences (batch rows), tokens (their non-padding positions,
    attention_mask) and epochs (the epoch of its latest row: the passes over it completed).
    `stops`: the sources (indices) that end the data at their first second-epoch row; `ended`
    is then that source's name, and the iterator stays ended. All of it lives in the
    iterator's state, so it survives a resume.
    """

    def __init__(self, parent: grain.DatasetIterator, names: Sequence[str], stops: Sequence[str] = ()):
        super().__init__(parent)  # grain's DatasetIterator keeps it as self._parent
        self.names = tuple(names)
        self._stops = np.isin(np.arange(len(names)), [self.names.index(name) for name in stops])
        self.sequences = np.zeros(len(names), np.int64)
        self.tokens = np.zeros(len(names), np.int64)
        self.epochs = np.zeros(len(names), np.int64)
        self._before = (self.sequences, self.tokens, self.epochs)  # the counts before the last batch
        self.ended = ""

    def __next__(self) -> dict:
        if self.ended:
            raise StopIteration
        batch = dict(next(self._parent))
        ids = np.asarray(batch.pop(SOURCE_IDS))
        epochs = np.asarray(batch.pop(SOURCE_EPOCHS))
        past_end = self._stops[ids] & (epochs > 0)
        if past_end.any():
            self.ended = self.names[int(ids[np.argmax(past_end)])]
            raise StopIteration
        self._before = (self.sequences.copy(), self.tokens.copy(), self.epochs.copy())
        self.sequences += np.bincount(ids, minlength=len(self.names))
        row_tokens = np.asarray(batch["attention_mask"]).sum(axis=1)
        self.tokens += np.bincount(ids, weights=row_tokens, minlength=len(self.names)).astype(np.int64)
        np.maximum.at(self.epochs, ids, epochs)
        return batch

    def forget_last_batch(self) -> None:
        """Takes the last batch out of the counts: another host's data ended, so it was not trained on."""
        self.sequences, self.tokens, self.epochs = self._before

    def get_state(self) -> dict:
        return {"batches": self._parent.get_state(), "sequences": self.sequences.tolist(),
                "tokens": self.tokens.tolist(), "epochs": self.epochs.tolist(), "ended": self.ended}

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state["batches"])
        self.sequences = np.asarray(state["sequences"], np.int64)
        self.tokens = np.asarray(state["tokens"], np.int64)
        self.epochs = np.asarray(state.get("epochs", np.zeros(len(self.names))), np.int64)  # older checkpoints
        self.ended = state.get("ended", "")


def count_metrics(names: Sequence[str], sequences: np.ndarray, tokens: np.ndarray,
                  epochs: np.ndarray | None = None) -> dict[str, float]:
    """data/<name>/sequences, data/<name>/tokens (cumulative), data/<name>/fraction (of sequences) and
    data/<name>/epochs (passes over the source completed, when given)."""
    total = max(int(np.sum(sequences)), 1)
    row = {}
    for i, (name, seqs, toks) in enumerate(zip(names, sequences, tokens)):
        row[f"data/{name}/sequences"] = int(seqs)
        row[f"data/{name}/tokens"] = int(toks)
        row[f"data/{name}/fraction"] = int(seqs) / total
        if epochs is not None:
            row[f"data/{name}/epochs"] = int(epochs[i])
    return row
