"""The tokenizer's training sample: `data.tokenizer.sample_bytes` drawn across the whole corpus.

A vocabulary trained on the alphabetically first files (books/ before web/) tokenizes the rest
badly, and nothing says so. The sample is drawn instead:

  file sources       (text, jsonl, parquet) every file's share of the bytes is its share of the
                     corpus's size; the files are visited in an order drawn from
                     `data.tokenizer.sample_seed`, and shares too small to be worth a read
                     (under MIN_FILE_BYTES, or a 64th of the sample if that is less) are pooled
                     into the next file of that order, so a
                     corpus of many small files gives a seeded subset of them, spread over it.
                     A file gives its train-split documents from its start until its share is
                     met; what a file lacks (a .gz is larger than its compressed size says)
                     passes to the next. A corpus smaller than sample_bytes is read whole.
  random access      (embedded, tfds) the train split's documents in an order drawn from the
                     seed, whole, until sample_bytes.
  a mixture          each source its weight's share of the bytes, drawn as above.

Only one document is held at a time: memory does not grow with the corpus. The sample's record
(tokenizer/sample.json, training.SampleRecord) says how many bytes each file (and each source of
a mixture) gave.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from data_pipelines import index_shuffle
from data_pipelines.sources import corpus, documents as sources, file_listing, mixture

ORDER_CHUNK = 4096  # positions of a random-access source's sample order computed at once
MIN_FILE_BYTES = 1 << 20  # a file opened for the sample gives at least this much (or all it holds)


def sample_segments(data_cfg, sample_bytes: int, seed: int, stats: sources.SkipStats,
                    source: str = "") -> Iterator[tuple[str, str, str]]:
    """(source name or "", file or source kind, segment) of the sample, about sample_bytes of UTF-8 text.

    Stops after the segment that reaches a file's (or the source's) share: the sample holds
    sample_bytes plus less than one segment per file read.
    """
    if sample_bytes <= 0:
        raise ValueError(f"config.data.tokenizer.sample_bytes={sample_bytes} must be positive")
    if mixture.has_mixture(data_cfg):
        # Each source gives its weight's share of the bytes (its own weight, not a schedule's).
        for (name, cfg), weight in zip(mixture.source_configs(data_cfg).items(), mixture.weights(data_cfg)):
            if weight > 0:
                yield from sample_segments(cfg, max(1, int(sample_bytes * weight)), seed, stats, name)
        return
    reader = sources.source_of(data_cfg)
    if isinstance(reader, sources.FileSource):
        yield from _file_sample(reader, sample_bytes, seed, stats, source)
        return
    yield from _random_access_sample(data_cfg, sample_bytes, seed, stats, source)


def expected_bytes(data_cfg, sample_bytes: int) -> int:
    """About how much the sample will hold: sample_bytes, or less for a corpus of uncompressed files that holds
    less (their train split's share of their size). The progress bar's total: a 1.5 MB corpus is not shown
    against a 100 MB cap. A compressed file's text size is not known before it is read: the cap stands."""
    if mixture.has_mixture(data_cfg):
        return sum(expected_bytes(cfg, max(1, int(sample_bytes * weight)))
                   for (_, cfg), weight in zip(mixture.source_configs(data_cfg).items(), mixture.weights(data_cfg))
                   if weight > 0)
    reader = sources.source_of(data_cfg)
    if not isinstance(reader, sources.FileSource):
        return sample_bytes
    size = file_listing.text_bytes(reader.files())
    if size is None:
        return sample_bytes
    return max(1, int(min(sample_bytes, size * (1.0 - data_cfg.get("eval_fraction", 0.0)))))


def _random_access_sample(data_cfg, sample_bytes: int, seed: int, stats: sources.SkipStats, source: str):
    """The embedded corpus and TFDS: whole train-split documents in an order drawn from `seed` (index_shuffle,
    ORDER_CHUNK positions at a time), so a dataset larger than the sample gives documents from all over it."""
    documents = sources.open_random_access(data_cfg, stats)
    seen = 0
    for first in range(0, len(documents), ORDER_CHUNK):
        positions = np.arange(first, min(first + ORDER_CHUNK, len(documents)))
        for index in index_shuffle.shuffle_positions(positions, len(documents), seed).tolist():
            if corpus.is_eval_document(index, data_cfg.eval_fraction):
                continue
            for segment in documents[index]:
                yield source, data_cfg.source, segment
                seen += len(segment.encode("utf-8"))
                if seen >= sample_bytes:
                    return


def file_shares(sizes: list[int], sample_bytes: int, seed: int) -> list[tuple[int, float]]:
    """(file index, bytes to take) in the seeded order: shares by size, small ones pooled forward.

    The shares sum to sample_bytes; a file's share is 0 when pooled into a later one.
    """
    total = sum(sizes)
    if total == 0:
        return []
    floor = min(MIN_FILE_BYTES, sample_bytes / 64)
    order = [int(i) for i in index_shuffle.permutation(len(sizes), seed % 2**32)]
    shares, pooled = [], 0.0
    for rank, index in enumerate(order):
        pooled += sample_bytes * sizes[index] / total
        if pooled >= floor or rank == len(order) - 1:
            shares.append((index, pooled))
            pooled = 0.0
    return shares


def _file_sample(reader: sources.FileSource, sample_bytes: int, seed: int, stats: sources.SkipStats, source: str):
    data_cfg = reader.cfg
    files = reader.files()
    sizes = file_listing.file_sizes(files)
    owed = 0.0  # what earlier files lacked of their share
    for index, share in file_shares(sizes, sample_bytes, seed):
        owed += share
        taken = 0
        for number, document in enumerate(reader.file_documents([files[index]], stats)):
            if taken >= owed:
                break
            if corpus.is_eval_document(corpus.file_document_id(index, number), data_cfg.eval_fraction):
                continue
            for segment in document:
                yield source, files[index], segment
                taken += len(segment.encode("utf-8"))
                if taken >= owed:
                    break
        owed = max(0.0, owed - taken)
