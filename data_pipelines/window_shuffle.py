"""grain's WindowShuffleIterDataset with each window's permutation computed at once (index_shuffle.py).

Same order and same iterator state as grain's; only `_fill_and_shuffle_window` differs.
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


class WindowShuffleIterDataset(grain.experimental.WindowShuffleIterDataset):
    """Drop-in for grain.experimental.WindowShuffleIterDataset: same order, same state."""

    def __iter__(self) -> grain.DatasetIterator:
        return _WindowShuffleIterator(self._parent.__iter__(), window_size=self._window_size, seed=self._seed)
