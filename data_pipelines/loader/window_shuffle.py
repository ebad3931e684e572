"""grain's WindowShuffleIterDataset with each window's permutation computed at once (index_shuffle.py).

Same order and same iterator state as grain's; `_fill_and_shuffle_window` computes the
permutation at once, and `__next__` is grain's without its per-element statistics.
"""

from __future__ import annotations

import grain
from grain._src.python.dataset.transformations import shuffle as grain_shuffle

from data_pipelines import index_shuffle


class _WindowShuffleIterator(grain_shuffle._WindowShuffleDatasetIterator):  # noqa: SLF001
    """grain's iterator (state, resume) with the vectorised permutation."""

    def _fill_and_shuffle_window(self):
        window = []
        try:
            for _ in range(self._window_size):
                window.append(next(self._parent))
        except StopIteration:
            self._parent_exhausted = True
        seed = self._global_seed + self._window_index
        self._window = [window[i] for i in index_shuffle.permutation(len(window), seed)]

    def __next__(self):
        # grain's __next__ without its per-element stats wrappers (several us per example).
        if not self._window:
            if self._parent_exhausted:
                raise StopIteration
            self._parent_window_start_iter_state = self._parent.get_state()
            self._fill_and_shuffle_window()
            self._pos_in_window = 0
        if not self._window:
            raise StopIteration
        self._pos_in_window += 1
        result = self._window.pop()
        if not self._window:
            self._window_index += 1
        return result


class WindowShuffleIterDataset(grain.experimental.WindowShuffleIterDataset):
    """Drop-in for grain.experimental.WindowShuffleIterDataset: same order, same state."""

    def __iter__(self) -> grain.DatasetIterator:
        return _WindowShuffleIterator(self._parent.__iter__(), window_size=self._window_size, seed=self._seed)
