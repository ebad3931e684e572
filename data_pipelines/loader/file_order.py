"""A stream's files in a seeded order, a new one each epoch, several read at once; resumed at a cursor.

`FileOrderFeed` is the feed (stream.py) of text, jsonl and parquet sources. Epoch e visits this
share's files in a permutation drawn from (seed + e) (index_shuffle, as RandomAccessFeed orders
documents) and reads `cycle_length` of them at once, a document from each in turn, a finished
file's place taken by the next file of the order: grain's interleave (`cycle_length`) over
files. A glob over books/ code/ web/ is then no curriculum by file name, and the first thousand
documents of an epoch come from several files.

A document's place in the stream (its position) counts this share's documents of both splits,
as before; its split is decided by a hash of its file's index (among the source's sorted files)
and its index in that file, so the held-out set does not move with the order, the hosts or the
epoch (for one file on one host, that is the position, as before).

Resuming: the feed records, for each position it hands out, a cursor (the files done, the open
files and how many documents of each were read, whose turn it is). The example stream keeps the
cursor of the document its replay starts at in its state; `open(epoch, start, cursor)` opens
the open files again and skips what was read of them: a resume re-reads at most `cycle_length`
partly read files, never the files before them. Without a cursor (a checkpoint from before),
it reads the epoch from its start.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from data_pipelines import index_shuffle
from data_pipelines.loader.stream import Document, Tokenize, _tokenized
from data_pipelines.sources import corpus

CYCLE_LENGTH = 4  # files of a stream read at once (grain's interleave cycle_length)


class FileOrderFeed:
    """This share's documents of one split of a file source, files in a seeded order per epoch.

    Args:
      files: the source's files, sorted (documents.resolve_files).
      read_file: (path, count_skips) -> the file's raw documents (FileSource.file_documents).
      keep: corpus.file_document_id -> whether the document belongs to this split.
      tokenize: encode_ids.
      shuffle_seed: None visits the files in sorted order, one at a time (eval).
    """

    def __init__(self, files: Sequence[str], read_file: Callable[[str, bool], Iterator[list[str]]],
                 keep: Callable[[int], bool], tokenize: Tokenize, *, shard_index: int, shard_count: int,
                 shuffle_seed: int | None, cycle_length: int = CYCLE_LENGTH):
        self._files = list(files)
        self._read_file = read_file
        self._keep = keep
        self._tokenize = tokenize
        self._shard = (shard_index, shard_count)
        self._shuffle_seed = shuffle_seed
        self._cycle_length = 1 if shuffle_seed is None else cycle_length

    def set_slice(self, index: int, count: int) -> None:
        """Narrows the share to its index-th of count parts (grain worker processes)."""
        host, hosts = self._shard
        self._shard = (host + hosts * index, hosts * count)

    def share(self) -> tuple[list[int], bool]:
        """(indices of the files this share reads, whether it reads whole files).

        With at least as many files as shares, share i reads files i, i + n, ...; with fewer,
        every share reads every file and keeps every n-th document (as documents.iter_documents).
        """
        index, count = self._shard
        if len(self._files) >= count:
            return list(range(index, len(self._files), count)), True
        return list(range(len(self._files))), False

    def file_order(self, epoch: int) -> list[int]:
        """The share's file indices in epoch `epoch`'s order."""
        share, _ = self.share()
        if self._shuffle_seed is None:
            return share
        seed = (self._shuffle_seed + epoch) % 2**32
        return [share[i] for i in index_shuffle.permutation(len(share), seed)]

    def open(self, epoch: int, start: int, cursor: dict | None = None) -> "FileInterleave":
        return FileInterleave(self, epoch, start, cursor)


class FileInterleave:
    """Iterator of (position, tokenized document) over an epoch of a FileOrderFeed; see the module docstring."""

    def __init__(self, feed: FileOrderFeed, epoch: int, start: int, cursor: dict | None):
        self._feed = feed
        self._order = feed.file_order(epoch)
        _, whole_files = feed.share()
        self._every = None if whole_files else feed._shard  # (index, count): keep every count-th document
        cursor = cursor or {"next_file": 0, "open": [], "turn": 0, "read": 0, "position": 0}
        if cursor["position"] > start:
            raise ValueError(f"a stream cursor at position {cursor['position']} cannot open at {start}")
        self._start = start
        self._cursors: dict[int, dict] = {}
        self._documents = _tokenized(self._raw(cursor), feed._tokenize)

    def _reader(self, order_index: int, skip: int) -> Iterator[list[str]]:
        file_index = self._order[order_index]
        counted = self._every is None or self._every[0] == 0  # shared files: share 0 alone counts skips
        documents = self._feed._read_file(self._feed._files[file_index], counted)
        for _ in range(skip):
            if next(documents, None) is None:
                break
        return documents

    def _raw(self, cursor: dict) -> Iterator[tuple[int, list[str]]]:
        next_file, turn, read, position = cursor["next_file"], cursor["turn"], cursor["read"], cursor["position"]
        slots = [[o, n, self._reader(o, n)] for o, n in cursor["open"]]
        while len(slots) < self._feed._cycle_length and next_file < len(self._order):
            slots.append([next_file, 0, self._reader(next_file, 0)])
            next_file += 1
        while slots:
            before = {"next_file": next_file, "open": [[o, n] for o, n, _ in slots], "turn": turn,
                      "read": read, "position": position}
            slot = slots[turn]
            document = next(slot[2], None)
            if document is None:  # the file is done: the next file of the order takes its place
                if next_file < len(self._order):
                    slots[turn] = [next_file, 0, self._reader(next_file, 0)]
                    next_file += 1
                else:
                    slots.pop(turn)
                    turn = turn % len(slots) if slots else 0
                continue
            index_in_file = slot[1]
            slot[1] += 1
            read += 1
            turn = (turn + 1) % len(slots)
            if self._every is not None and (read - 1) % self._every[1] != self._every[0]:
                continue
            position += 1
            if position - 1 < self._start:
                continue
            if self._feed._keep(corpus.file_document_id(self._order[slot[0]], index_in_file)):
                self._cursors[position - 1] = before
                yield position - 1, document

    def __iter__(self) -> "FileInterleave":
        return self

    def __next__(self) -> tuple[int, Document]:
        return next(self._documents)

    def cursor_at(self, position: int) -> dict:
        """The cursor that reopens the stream at the document of `position` (handed out, not forgotten)."""
        return self._cursors[position]

    def forget_before(self, position: int) -> None:
        """Drops the cursors of positions before `position` (no replay will start there)."""
        while self._cursors and next(iter(self._cursors)) < position:  # kept in position order
            del self._cursors[next(iter(self._cursors))]


def keep_split(split: str, eval_fraction: float, document: int) -> bool:
    """Whether corpus.file_document_id `document` belongs to `split` (corpus.is_eval_document on its id)."""
    return corpus.is_eval_document(document, eval_fraction) == (split == "eval")
