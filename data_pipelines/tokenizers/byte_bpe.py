"""Byte-level BPE, RoBERTa's tokenizer (`config.data.tokenizer.kind=bpe`): <s> <pad> </s> <unk> <mask> are ids 0..4
(RoBERTa's order), no byte is unknown, and `Ġ` marks a word that follows a space. Saved as tokenizer.json,
vocab.json and merges.txt (RobertaTokenizer)."""
from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from bert_jax.storage import paths
from data_pipelines.tokenizers.kinds import HfTokenizer, SpecialTokens, TokenizerKind, register_kind

BPE_SPECIALS = SpecialTokens("<pad>", "<unk>", "<s>", "</s>", "<mask>")


def train_byte_bpe(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    *,
    lowercase: bool = False,
    specials: SpecialTokens | None = None,
) -> HfTokenizer:
    """RoBERTa's byte-level BPE: no unknown bytes; specials <s> <pad> </s> <unk> <mask> = 0..4.

    Every segment is encoded with a prefix space (add_prefix_space=True), so a segment's
    first word is a `Ġ` word start like any other: whole-word masking then sees it.
    """
    specials = specials or BPE_SPECIALS
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
    return HfTokenizer("bpe", hf, specials)


def _save_files(tokenizer: HfTokenizer, directory: str) -> dict:
    """vocab.json and merges.txt beside tokenizer.json, for RobertaTokenizer (the slow class)."""
    with tempfile.TemporaryDirectory() as local:  # the model writes only to local disk
        for saved in tokenizer.hf.model.save(local):
            paths.copy_file(saved, paths.path(directory) / paths.path(saved).name)
    return {"add_prefix_space": True, "bos_token": tokenizer.specials.cls, "eos_token": tokenizer.specials.sep}


def _extend(tokenizer: HfTokenizer, words: Sequence[str], old_size: int) -> HfTokenizer:
    """Byte-level BPE cannot build a whole word from merges without adding the intermediate merges as tokens
    too, and those would re-cut other words: each word becomes an added token of tokenizer.json instead,
    matched as a whole word only, with the space before it absorbed (as RoBERTa's <mask>)."""
    hf = tokenizers.Tokenizer.from_str(tokenizer.hf.to_str())
    hf.add_tokens([tokenizers.AddedToken(w, single_word=True, lstrip=True, normalized=True) for w in words])
    return HfTokenizer(tokenizer.kind, hf, tokenizer.specials)


BYTE_BPE = register_kind(TokenizerKind(
    name="bpe", specials=BPE_SPECIALS, hf_class="RobertaTokenizer", train=train_byte_bpe, hf_model="BPE",
    save_files=_save_files, extend=_extend, extends=HfTokenizer, space_marker="Ġ"))
