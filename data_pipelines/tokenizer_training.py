"""Training tokenizers on a streamed, size-capped sample of a source's training documents.

    train_from_config(data_cfg)   -> the kind `data.tokenizer.kind` names, trained on at most
                                     `data.tokenizer.sample_bytes` of the train split's text

WordPiece and byte-level BPE train with `tokenizers` from an iterator; SentencePiece
(unigram, BPE) trains with `sentencepiece` from an iterator of segments, writing the model
to memory. Only the sample is ever held (SentencePiece keeps its sentences; `tokenizers`
keeps word counts), so the source's size does not matter.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator

import ml_collections
import sentencepiece as spm
import tokenizers
from absl import logging
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from data_pipelines import corpus, sources
from data_pipelines import tokenizer as tokenizer_lib
from data_pipelines.tokenizer import SpecialTokens

# SentencePiece skips sentences longer than this (its own default is 4192 bytes).
_MAX_SENTENCE_BYTES = 16_384


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    *,
    lowercase: bool = True,
    specials: SpecialTokens | None = None,
) -> tokenizer_lib.HfTokenizer:
    """BERT WordPiece (BertNormalizer, BertPreTokenizer); specials get ids 0..4 in pad..mask order."""
    specials = specials or tokenizer_lib.DEFAULT_SPECIALS["wordpiece"]
    hf = tokenizers.Tokenizer(models.WordPiece(unk_token=specials.unk))
    hf.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(specials.all()),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer=trainer)
    tokenizer_lib.add_pair_template(hf, specials)
    return tokenizer_lib.HfTokenizer("wordpiece", hf, specials)


def train_byte_bpe(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    *,
    lowercase: bool = False,
    specials: SpecialTokens | None = None,
) -> tokenizer_lib.HfTokenizer:
    """RoBERTa's byte-level BPE: no unknown bytes; specials <s> <pad> </s> <unk> <mask> = 0..4.

    Every segment is encoded with a prefix space (add_prefix_space=True), so a segment's
    first word is a `Ġ` word start like any other: whole-word masking then sees it.
    """
    specials = specials or tokenizer_lib.DEFAULT_SPECIALS["bpe"]
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
    return tokenizer_lib.HfTokenizer("bpe", hf, specials)


def train_sentencepiece(
    texts: Iterable[str],
    vocab_size: int,
    *,
    kind: str = "unigram",
    lowercase: bool = True,
    specials: SpecialTokens | None = None,
) -> tokenizer_lib.SentencePieceTokenizer:
    """ALBERT's SentencePiece (unigram or BPE): <pad>=0 <unk>=1 [CLS]=2 [SEP]=3 [MASK]=4.

    Lowercasing is the model's own normalisation rule (nmt_nfkc_cf), so spiece.model
    carries it to every loader. The vocabulary may come out smaller than vocab_size on a
    small sample (hard_vocab_limit off) rather than failing.
    """
    if kind not in tokenizer_lib.SENTENCEPIECE_KINDS:
        raise ValueError(f"kind={kind!r} is not a SentencePiece kind {tokenizer_lib.SENTENCEPIECE_KINDS}")
    specials = specials or tokenizer_lib.DEFAULT_SPECIALS[kind]
    model = io.BytesIO()
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
        num_threads=max(1, os.cpu_count() or 1),
        minloglevel=2,
    )
    return tokenizer_lib.SentencePieceTokenizer(kind, model.getvalue(), specials, lowercase)


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
    seen = 0
    for index, document in enumerate(sources.iter_documents(data_cfg, stats=stats)):
        if corpus.is_eval_document(index, data_cfg.eval_fraction):
            continue
        for segment in document:
            yield segment
            seen += len(segment.encode("utf-8"))
            if seen >= sample_bytes:
                return


def train_from_config(data_cfg: ml_collections.ConfigDict) -> tokenizer_lib.Tokenizer:
    """Trains `data.tokenizer.kind` with `data.vocab_size` tokens on the source's sample."""
    tok_cfg = data_cfg.tokenizer
    kind = tok_cfg.kind
    specials = tokenizer_lib.parse_specials(kind, tok_cfg.get("special_tokens", ""))
    stats = sources.SkipStats()
    texts = training_sample(data_cfg, tok_cfg.sample_bytes, stats)
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
    return tokenizer
