"""Training tokenizers on a streamed, size-capped sample of a source's training documents.

    train_from_config(data_cfg)   -> (the kind `data.tokenizer.kind` names, trained on about
                                     `data.tokenizer.sample_bytes` of the train split's text drawn
                                     across all files and sources (sample.py); the sample's record:
                                     bytes, segments, sha256, bytes per file and per source)

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

from bert_jax.progress import progress
from data_pipelines.sources import documents as sources
from data_pipelines.tokenizers import kinds as tokenizer_kinds, sample

# The `config.data` keys that decide a trained tokenizer: the source, how documents split into
# segments, which documents are held out, and the tokenizer block. train_from_config reads only
# these (it trains from `training_settings`), so two configs with equal settings train equal
# tokenizers and may share one (launch/sweep.py).
TRAINING_KEYS = ("source", "path", "field", "tfds_name", "tfds_split", "tfds_data_dir", "segmenter",
                 "max_line_bytes", "eval_fraction", "vocab_size", "mixture")
TOKENIZER_KEYS = ("kind", "sample_bytes", "sample_seed", "lowercase", "min_frequency", "special_tokens")


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
    files: bytes each file (or source kind: embedded, tfds) gave; sources: bytes each source of
    a mixture gave (sample.py draws them).
    """

    bytes: int = 0
    segments: int = 0
    sha256: str = ""
    vocab_size_asked: int = 0
    vocab_size: int = 0
    sample_seed: int = 0
    files: dict = dataclasses.field(default_factory=dict)
    sources: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class _RecordedSample:
    """Iterates the sample once, counting and hashing what the trainer is given."""

    def __init__(self, texts: Iterable[tuple[str, str, str]], record: SampleRecord, sample_bytes: int):
        self._texts = texts  # (source name or "", file, segment): sample.sample_segments
        self._record = record
        self._digest = hashlib.sha256()
        self._sample_bytes = sample_bytes  # the progress bar's total: the cap, or the smaller corpus's train split

    def __iter__(self) -> Iterator[str]:
        bar = progress(total=self._sample_bytes, desc="tokenizer sample", unit="B", unit_scale=True)
        for source, origin, text in self._texts:
            data = text.encode("utf-8")
            bar.update(len(data))
            self._digest.update(data + b"\n")
            self._record.bytes += len(data)
            self._record.segments += 1
            self._record.files[origin] = self._record.files.get(origin, 0) + len(data)
            if source:
                self._record.sources[source] = self._record.sources.get(source, 0) + len(data)
            yield text
        bar.total = max(bar.n, 1)  # the total was an estimate: the bar ends at what was read
        bar.close()
        self._record.sha256 = self._digest.hexdigest()


def training_sample(
    data_cfg: ml_collections.ConfigDict, sample_bytes: int, stats: sources.SkipStats
) -> Iterator[str]:
    """The train split's segments that train the tokenizer: about sample_bytes drawn across every file
    (and every source of a mixture, by weight) from data.tokenizer.sample_seed (sample.py)."""
    seed = (data_cfg.get("tokenizer") or {}).get("sample_seed", 0)
    for _, _, segment in sample.sample_segments(data_cfg, sample_bytes, seed, stats):
        yield segment


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
    seed = tok_cfg.get("sample_seed", 0)
    record = SampleRecord(vocab_size_asked=data_cfg.vocab_size, sample_seed=seed)
    texts = _RecordedSample(sample.sample_segments(data_cfg, tok_cfg.sample_bytes, seed, stats), record,
                            sample.expected_bytes(data_cfg, tok_cfg.sample_bytes))
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
