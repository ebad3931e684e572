"""Training tokenizers on a streamed, size-capped sample of a source's training documents.

    train_from_config(data_cfg)   -> (the kind `data.tokenizer.kind` names, trained on at most
                                     `data.tokenizer.sample_bytes` of the train split's text;
                                     the sample's record: bytes, segments, sha256)

Each kind trains with its own `train` (its record, `tokenizer_kinds.get_kind`): WordPiece and
byte-level BPE with `tokenizers` from an iterator (wordpiece.py, byte_bpe.py); SentencePiece
(unigram, BPE) with `sentencepiece` from an iterator of segments, writing the model to memory
(sentencepiece.py). Only the sample is ever held (SentencePiece and WordPiece keep its segments;
byte-level BPE keeps word counts), so the source's size does not matter.

Every kind is deterministic: the same sample and settings give byte-identical files in any
process, under any PYTHONHASHSEED, RAYON_NUM_THREADS or core count. What each trainer needed:
  wordpiece          `tokenizers` numbers the `##c` continuation pieces in the order its
                     word-count hash map yields them (a random order per process), and BPE
                     breaks count ties by piece id; so the merges, and at the vocabulary's edge
                     the pieces, differed run to run. We give the trainer every `##c` up front,
                     sorted, then renumber canonically (see wordpiece.train_wordpiece).
  bpe                already deterministic: its 256 byte symbols are numbered in byte order
                     before any word is read, and ties are broken by those ids.
  unigram,           SentencePiece splits its sentences among `num_threads` threads and sums
  sentencepiece_bpe  their float statistics per thread: a different thread count gives another
                     model. The thread count is fixed (_SENTENCEPIECE_THREADS), not the core
                     count, and the trainer's random seed is set. Its own order is kept:
                     specials, then pieces by score, ties broken by the piece's text.
Every trainer stops at vocab_size in its (now fixed) order, so ties at the vocabulary's edge
are cut the same way every time (by pair ids for `tokenizers`' merges; by SentencePiece's own
sort for its pieces). `tokenizers` counts in integers, so its result cannot depend on the CPU.
SentencePiece's statistics are floats (log, digamma): another build of the library, or a CPU
that rounds differently, may give another model; this was not measured on a second machine.
A run that must not depend on that trains once and passes the files (`data.tokenizer.path`),
as sweeps do.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator

import ml_collections
from absl import logging

from data_pipelines.sources import corpus, documents as sources, mixture
from data_pipelines.tokenizers import kinds as tokenizer_kinds

# The `config.data` keys that decide a trained tokenizer: the source, how documents split into
# segments, which documents are held out, and the tokenizer block. train_from_config reads only
# these (it trains from `training_settings`), so two configs with equal settings train equal
# tokenizers and may share one (launch/sweep.py).
TRAINING_KEYS = ("source", "path", "field", "tfds_name", "tfds_split", "tfds_data_dir", "segmenter",
                 "max_line_bytes", "eval_fraction", "vocab_size", "mixture")
TOKENIZER_KEYS = ("kind", "sample_bytes", "lowercase", "min_frequency", "special_tokens")


def training_settings(data_cfg: ml_collections.ConfigDict) -> dict:
    """The settings a trained tokenizer is a function of (TRAINING_KEYS, TOKENIZER_KEYS), as plain values."""
    tok_cfg = data_cfg.tokenizer
    settings = {key: data_cfg.get(key) for key in TRAINING_KEYS if key in data_cfg}
    if isinstance(settings.get("mixture"), ml_collections.ConfigDict):
        settings["mixture"] = settings["mixture"].to_dict()
    settings["tokenizer"] = {key: tok_cfg.get(key) for key in TOKENIZER_KEYS if key in tok_cfg}
    return settings


@dataclasses.dataclass
class SampleRecord:
    """What a tokenizer was trained on, so a later run can tell it is looking at the same input.

    sha256 is over the segments' UTF-8 bytes, each followed by a newline, in sample order.
    """

    bytes: int = 0
    segments: int = 0
    sha256: str = ""
    vocab_size_asked: int = 0
    vocab_size: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class _RecordedSample:
    """Iterates the sample once, counting and hashing what the trainer is given."""

    def __init__(self, texts: Iterable[str], record: SampleRecord):
        self._texts = texts
        self._record = record
        self._digest = hashlib.sha256()

    def __iter__(self) -> Iterator[str]:
        for text in self._texts:
            data = text.encode("utf-8")
            self._digest.update(data + b"\n")
            self._record.bytes += len(data)
            self._record.segments += 1
            yield text
        self._record.sha256 = self._digest.hexdigest()


def training_sample(
    data_cfg: ml_collections.ConfigDict, sample_bytes: int, stats: sources.SkipStats
) -> Iterator[str]:
    """The train split's segments, in source order, until sample_bytes of UTF-8 text.

    Held-out documents (corpus.is_eval_document on the document's index in the whole
    source) are left out: on one host exactly the pipeline's eval documents. (A
    multi-host stream holds out by position within each host's share, so there the
    sample may include a few of them.)
    """
    if sample_bytes <= 0:
        raise ValueError(f"config.data.tokenizer.sample_bytes={sample_bytes} must be positive")
    if mixture.has_mixture(data_cfg):
        # Each source gives its weight's share of the bytes (its own weight, not a schedule's).
        for (name, cfg), weight in zip(mixture.source_configs(data_cfg).items(), mixture.weights(data_cfg)):
            if weight > 0:
                yield from training_sample(cfg, max(1, int(sample_bytes * weight)), stats)
        return
    seen = 0
    for index, document in enumerate(sources.iter_documents(data_cfg, stats=stats)):
        if corpus.is_eval_document(index, data_cfg.eval_fraction):
            continue
        for segment in document:
            yield segment
            seen += len(segment.encode("utf-8"))
            if seen >= sample_bytes:
                return


def train_from_config(data_cfg: ml_collections.ConfigDict) -> tuple[tokenizer_kinds.Tokenizer, SampleRecord]:
    """Trains `data.tokenizer.kind` with `data.vocab_size` tokens on the source's sample.

    Reads only `training_settings(data_cfg)`. Returns the tokenizer and its sample's record.
    A sample too small for the vocabulary gives a smaller one, with a warning naming both
    sizes (config.model.vocab_size stays as set: the extra embedding rows go unused).
    """
    data_cfg = ml_collections.ConfigDict(training_settings(data_cfg))
    tok_cfg = data_cfg.tokenizer
    kind = tok_cfg.kind
    specials = tokenizer_kinds.parse_specials(kind, tok_cfg.get("special_tokens", ""))
    stats = sources.SkipStats()
    record = SampleRecord(vocab_size_asked=data_cfg.vocab_size)
    texts = _RecordedSample(training_sample(data_cfg, tok_cfg.sample_bytes, stats), record)
    min_frequency = tok_cfg.get("min_frequency", 2)
    tokenizer = tokenizer_kinds.get_kind(kind).train(
        texts, data_cfg.vocab_size, min_frequency, lowercase=tok_cfg.lowercase, specials=specials
    )
    if stats.total():
        logging.info("tokenizer sample: %s", stats.log_line())
    record.vocab_size = tokenizer.get_vocab_size()
    if record.vocab_size < record.vocab_size_asked:
        logging.warning(
            "config.data.vocab_size=%d but the %s tokenizer trained on %d bytes of sample "
            "(config.data.tokenizer.sample_bytes=%d) has only %d tokens: the sample holds too "
            "few distinct pieces. Ids %d..%d stay unused. Give a larger sample (more text, or a "
            "larger sample_bytes) or a smaller config.model.vocab_size.",
            record.vocab_size_asked, kind, record.bytes, tok_cfg.sample_bytes, record.vocab_size,
            record.vocab_size, record.vocab_size_asked - 1,
        )
    return tokenizer, record
