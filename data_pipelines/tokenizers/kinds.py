"""Tokenizer kinds: the tokenizer object's interface, and the registry of kinds (`config.data.tokenizer.kind`).

A kind is one file in this package that defines its `TokenizerKind` record and registers it:
wordpiece.py (BERT), byte_bpe.py (RoBERTa's byte-level BPE), sentencepiece.py (ALBERT's unigram, and
SentencePiece BPE). Training, loading, saving, masking's word starts and vocabulary extension ask the
record (`get_kind`) for what differs between kinds, and never branch on a kind's name. tokenizer.py
loads, saves and hands tokenizers out; import from there.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tokenizers
from tokenizers import processors

from bert_jax.registry import Registry
from bert_jax.storage import paths

TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILE = "vocab.txt"
SENTENCEPIECE_FILE = "spiece.model"
CONFIG_FILE = "tokenizer_config.json"


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """The strings of the five special tokens, in SpecialIds' field order."""

    pad: str
    unk: str
    cls: str
    sep: str
    mask: str

    def all(self) -> tuple[str, ...]:
        return (self.pad, self.unk, self.cls, self.sep, self.mask)


def _marks_a_word_start(token: str) -> bool:
    """SentencePiece and byte-level BPE mark the first piece of a word (`▁`, `Ġ`)."""
    return token.startswith(("Ġ", "▁"))


def _generic_fast_files(tokenizer: HfTokenizer, directory: str) -> dict:
    """A `tokenizers` tokenizer with no slow transformers class of its own (a Unigram tokenizer.json loaded from
    elsewhere): tokenizer.json alone, read by the generic fast class."""
    return {"tokenizer_class": "PreTrainedTokenizerFast"}


@dataclasses.dataclass(frozen=True)
class TokenizerKind:
    """One kind, whole: what the shared code (training, loading, saving, word starts, vocabulary extension)
    asks of it."""

    name: str  # its value of config.data.tokenizer.kind
    specials: SpecialTokens  # its default special tokens (config.data.tokenizer.special_tokens overrides them)
    hf_class: str  # tokenizer_config.json's tokenizer_class: what transformers' AutoTokenizer builds
    # train(texts, vocab_size, min_frequency=2, *, lowercase, specials=None) -> Tokenizer; deterministic: the same
    # texts and settings give byte-identical files (training.py says what each trainer needed for that).
    train: Callable[..., Tokenizer]
    # Loading (tokenizer.py): the `tokenizers` model type of a tokenizer.json of this kind ("WordPiece", "BPE",
    # "Unigram"), the SentencePiece model type of a .model file ("UNIGRAM", "BPE"), and vocab_file(path,
    # lowercase) -> tokenizers.Tokenizer for a one-token-per-line vocab.txt; empty where the kind has none.
    hf_model: str = ""
    sentencepiece_model: str = ""
    vocab_file: Callable[[str, bool], tokenizers.Tokenizer] | None = None
    # Held as a `tokenizers.Tokenizer` (HfTokenizer): whether a vocabulary entry begins a word (whole-word and
    # span masking), and save_files(tokenizer, directory) -> tokenizer_config.json entries, writing the files
    # beside tokenizer.json that the kind's slow transformers class reads.
    word_start: Callable[[str], bool] = _marks_a_word_start
    save_files: Callable[[Any, str], dict] = _generic_fast_files
    # Vocabulary extension (extension.py): extend(tokenizer, words, old_size) -> a new tokenizer with `words`
    # appended as ids old_size, old_size + 1, ..., for a tokenizer of class `extends` (None: not extendable);
    # space_marker: how the pre-tokenizer marks a word that follows a space (`Ġ` for byte-level BPE).
    extend: Callable[[Any, Sequence[str], int], Tokenizer] | None = None
    extends: type | None = None
    space_marker: str = ""


KINDS: Registry[TokenizerKind] = Registry("config.data.tokenizer.kind", "kinds")


def register_kind(kind: TokenizerKind) -> TokenizerKind:
    return KINDS.register(kind.name, kind)


def known_kinds() -> tuple[str, ...]:
    """The registered kinds, in registration order (this package's __init__ imports each kind's file)."""
    return KINDS.names()


def get_kind(name: str) -> TokenizerKind:
    return KINDS.get(name)


def parse_specials(kind: str, names: str | Sequence[str] = "") -> SpecialTokens:
    """Kind's default specials, or five comma-separated names in pad,unk,cls,sep,mask order."""
    default = get_kind(kind).specials
    if not names:
        return default
    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    if len(names) != 5 or not all(names) or len(set(names)) != 5:
        raise ValueError(
            f"config.data.tokenizer.special_tokens={names!r} must be five distinct names in the "
            "order pad,unk,cls,sep,mask"
        )
    return SpecialTokens(*names)


class Tokenizer(abc.ABC):
    """What the data pipeline needs of any tokenizer kind; subclasses hold the library object."""

    kind: str
    specials: SpecialTokens

    @abc.abstractmethod
    def get_vocab_size(self) -> int:
        """Ids run from 0 to this, exclusive."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """None for a token the vocabulary lacks."""

    @abc.abstractmethod
    def id_to_token(self, index: int) -> str:
        """The vocabulary entry of `index`."""

    @abc.abstractmethod
    def encode_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Tokenizes each text without special tokens: one [num_tokens] int32 array per text."""

    @abc.abstractmethod
    def word_start_flags(self) -> np.ndarray:
        """[vocab_size] bool: True where a token begins a word (whole-word / span masking).

        A WordPiece token begins a word unless it starts with `##`; a SentencePiece or
        byte-level BPE token begins one when it starts with `▁` / `Ġ`. Specials count as
        word starts, so a masked word never swallows them.
        """

    @abc.abstractmethod
    def save(self, directory: str) -> None:
        """Writes the files transformers' AutoTokenizer loads, with tokenizer_config.json."""

    def fast_tokenizer(self) -> tokenizers.Tokenizer | None:
        """This tokenizer as a `tokenizers.Tokenizer` (offsets and word ids, which fine-tuning's span and
        token tasks need), or None for a kind that has none (a SentencePiece unigram model)."""
        return None

    def _config_json(self, extra: dict) -> dict:
        return {
            "tokenizer_class": get_kind(self.kind).hf_class,
            "pad_token": self.specials.pad,
            "unk_token": self.specials.unk,
            "cls_token": self.specials.cls,
            "sep_token": self.specials.sep,
            "mask_token": self.specials.mask,
            "model_max_length": 512,
            **extra,
        }

    def _write_config(self, directory: str, extra: dict) -> None:
        paths.write_atomically(paths.path(directory) / CONFIG_FILE, json.dumps(self._config_json(extra), indent=2))


class HfTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` (WordPiece or byte-level BPE; also a loaded Unigram JSON)."""

    def __init__(self, kind: str, hf: tokenizers.Tokenizer, specials: SpecialTokens):
        self.kind = kind
        self.hf = hf  # The library object, for pair encodings and decoding.
        self.specials = specials

    def fast_tokenizer(self) -> tokenizers.Tokenizer:
        return self.hf

    def get_vocab_size(self) -> int:
        return self.hf.get_vocab_size()

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)

    def id_to_token(self, index: int) -> str:
        return self.hf.id_to_token(index)

    def encode_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        # encode_batch_fast skips offsets; the batch runs in parallel in Rust.
        encodings = self.hf.encode_batch_fast(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encodings]

    def word_start_flags(self) -> np.ndarray:
        flags_ = np.zeros(self.get_vocab_size(), bool)
        word_start = get_kind(self.kind).word_start
        for token, index in self.hf.get_vocab().items():
            flags_[index] = word_start(token)
        for token in self.specials.all():
            if self.token_to_id(token) is not None:
                flags_[self.token_to_id(token)] = True
        for index in self.hf.get_added_tokens_decoder():  # specials, and whole words added (tokenizer_extension)
            flags_[index] = True
        return flags_

    def save(self, directory: str) -> None:
        paths.write_atomically(paths.path(directory) / TOKENIZER_FILE, self.hf.to_str(pretty=True))
        self._write_config(directory, get_kind(self.kind).save_files(self, directory))


def add_pair_template(hf: tokenizers.Tokenizer, specials: SpecialTokens) -> None:
    """[CLS] A [SEP] B [SEP], type ids 0 then 1, as BertTokenizer builds pairs."""
    cls, sep = specials.cls, specials.sep
    hf.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, hf.token_to_id(cls)), (sep, hf.token_to_id(sep))],
    )
