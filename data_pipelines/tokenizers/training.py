"""Training tokenizers on a streamed, size-capped sample of a source's training documents.

    train_from_config(data_cfg)   -> (the kind `data.tokenizer.kind` names, trained on at most
                                     `data.tokenizer.sample_bytes` of the train split's text;
                                     the sample's record: bytes, segments, sha256)

WordPiece and byte-level BPE train with `tokenizers` from an iterator; SentencePiece
(unigram, BPE) trains with `sentencepiece` from an iterator of segments, writing the model
to memory. Only the sample is ever held (SentencePiece and WordPiece keep its segments;
byte-level BPE keeps word counts), so the source's size does not matter.

Every kind is deterministic: the same sample and settings give byte-identical files in any
process, under any PYTHONHASHSEED, RAYON_NUM_THREADS or core count. What each trainer needed:
  wordpiece          `tokenizers` numbers the `##c` continuation pieces in the order its
                     word-count hash map yields them (a random order per process), and BPE
                     breaks count ties by piece id; so the merges, and at the vocabulary's edge
                     the pieces, differed run to run. We give the trainer every `##c` up front,
                     sorted, then renumber canonically (see train_wordpiece).
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
import io
from collections.abc import Iterable, Iterator

import ml_collections
import sentencepiece as spm
import tokenizers
from absl import logging
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from data_pipelines.sources import corpus, documents as sources, mixture
from data_pipelines.tokenizers import kinds as tokenizer_kinds
from data_pipelines.tokenizers.kinds import SpecialTokens

# SentencePiece skips sentences longer than this (its own default is 4192 bytes).
_MAX_SENTENCE_BYTES = 16_384
# SentencePiece's result depends on its thread count (per-thread float sums), so it is fixed
# here rather than taken from the machine; 16 threads on 2 cores cost nothing measurable.
_SENTENCEPIECE_THREADS = 16
_SENTENCEPIECE_SEED = 0

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


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    *,
    lowercase: bool = True,
    specials: SpecialTokens | None = None,
) -> tokenizer_kinds.HfTokenizer:
    """BERT WordPiece (BertNormalizer, BertPreTokenizer), deterministic; specials get ids 0..4.

    Ids in canonical order: the specials (pad..mask), the single characters by code point, the
    `##c` continuation characters by code point, then the learned pieces in merge order (by
    count, ties broken by the ids of the pair merged, which are canonical too).

    `tokenizers` would number each `##c` when it first meets it in its word-count hash map,
    whose order changes with every process, and break count ties by those ids. So the trainer
    gets every `##c` the sample can hold up front, in sorted order (as extra special tokens,
    which are only seeds of its vocabulary and not kept as specials). Such a `##c` is found
    per distinct character of the sample, by normalising and pre-tokenizing it inside a word;
    one that only ever stands alone (a one-letter word) is kept as an unused entry. The
    texts are held in memory for this second look (bounded by the sample's size).
    """
    specials = specials or tokenizer_kinds.DEFAULT_SPECIALS["wordpiece"]
    texts = list(texts)
    hf = tokenizer_kinds.bert_wordpiece({specials.unk: 0}, lowercase, specials)
    seeds = sorted(_continuation_pieces(hf, texts))
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[*specials.all(), *seeds],
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer=trainer)
    vocab = hf.get_vocab()
    first_learned = len(specials.all()) + len(seeds) + sum(
        1 for token in vocab if len(token) == 1 and token not in specials.all()
    )
    base = sorted((t for t, i in vocab.items() if len(specials.all()) <= i < first_learned),
                  key=lambda t: (t.startswith("##"), t))
    learned = sorted((t for t, i in vocab.items() if i >= first_learned), key=vocab.get)
    canonical = [*specials.all(), *base, *learned]
    trained = tokenizer_kinds.bert_wordpiece({t: i for i, t in enumerate(canonical)}, lowercase, specials)
    trained.add_special_tokens(list(specials.all()))
    return tokenizer_kinds.HfTokenizer("wordpiece", trained, specials)


def _continuation_pieces(hf: tokenizers.Tokenizer, texts: list[str]) -> set[str]:
    """`##c` for every character c that the sample's text can put after a word's first letter."""
    characters = set()
    for text in texts:
        characters.update(text)
    pieces = set()
    for character in characters:
        words = hf.pre_tokenizer.pre_tokenize_str(hf.normalizer.normalize_str(f"a{character}a"))
        if len(words) == 1:  # Inside a word: "a", the character's normal form, "a".
            pieces.update("##" + c for c in words[0][0][1:-1])
    return pieces


def train_byte_bpe(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    *,
    lowercase: bool = False,
    specials: SpecialTokens | None = None,
) -> tokenizer_kinds.HfTokenizer:
    """RoBERTa's byte-level BPE: no unknown bytes; specials <s> <pad> </s> <unk> <mask> = 0..4.

    Every segment is encoded with a prefix space (add_prefix_space=True), so a segment's
    first word is a `Ġ` word start like any other: whole-word masking then sees it.
    """
    specials = specials or tokenizer_kinds.DEFAULT_SPECIALS["bpe"]
    hf = tokenizers.Tokenizer(models.BPE())
    if lowercase:
        hf.normalizer = normalizers.Lowercase()
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        # RoBERTa's id order: <s>=0 <pad>=1 </s>=2 <unk>=3 <mask>=4.
        special_tokens=[specials.cls, specials.pad, specials.sep, specials.unk, specials.mask],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer=trainer)
    hf.post_processor = processors.RobertaProcessing(
        (specials.sep, hf.token_to_id(specials.sep)),
        (specials.cls, hf.token_to_id(specials.cls)),
        add_prefix_space=True,
    )
    return tokenizer_kinds.HfTokenizer("bpe", hf, specials)


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    *,
    kind: str = "unigram",
    lowercase: bool = True,
    specials: SpecialTokens | None = None,
) -> tokenizer_kinds.SentencePieceTokenizer:
    """ALBERT's SentencePiece (unigram or BPE): <pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4.

    Lowercasing is the model's own normalisation rule (nmt_nfkc_cf), so spiece.model
    carries it to every loader. The vocabulary may come out smaller than vocab_size on a
    small sample (hard_vocab_limit off) rather than failing.
    """
    if kind not in tokenizer_kinds.SENTENCEPIECE_KINDS:
        raise ValueError(f"kind={kind!r} is not a SentencePiece kind {tokenizer_kinds.SENTENCEPIECE_KINDS}")
    specials = specials or tokenizer_kinds.DEFAULT_SPECIALS[kind]
    model = io.BytesIO()
    spm.set_random_generator_seed(_SENTENCEPIECE_SEED)  # Sampling and shuffles, if any apply.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        model_type="bpe" if kind == "sentencepiece_bpe" else "unigram",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        pad_id=0,
        pad_piece=specials.pad,
        unk_id=1,
        unk_piece=specials.unk,
        bos_id=-1,
        eos_id=-1,
        control_symbols=[specials.cls, specials.sep, specials.mask],
        normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
        character_coverage=0.9995,
        max_sentence_length=_MAX_SENTENCE_BYTES,
        num_threads=_SENTENCEPIECE_THREADS,
        minloglevel=2,
    )
    return tokenizer_kinds.SentencePieceTokenizer(kind, model.getvalue(), specials, lowercase)


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
    if kind == "wordpiece":
        tokenizer = train_wordpiece(
            texts, data_cfg.vocab_size, min_frequency, lowercase=tok_cfg.lowercase, specials=specials
        )
    elif kind == "bpe":
        tokenizer = train_byte_bpe(
            texts, data_cfg.vocab_size, min_frequency, lowercase=tok_cfg.lowercase, specials=specials
        )
    else:
        tokenizer = train_sentencepiece(
            texts, data_cfg.vocab_size, kind=kind, lowercase=tok_cfg.lowercase, specials=specials
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
