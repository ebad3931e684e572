"""The tokenizer object: one interface over `tokenizers` (WordPiece, byte-level BPE) and
SentencePiece (unigram, BPE), with each kind's special tokens and Hugging Face files.

tokenizer.py loads, trains (through tokenizer_training.py, which builds on this module
alone) and hands these out; import from there.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import tempfile
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm
import tokenizers
from tokenizers import models, normalizers, pre_tokenizers, processors

from bert_jax.storage import paths

KINDS = ("wordpiece", "bpe", "unigram", "sentencepiece_bpe")
SENTENCEPIECE_KINDS = ("unigram", "sentencepiece_bpe")
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


DEFAULT_SPECIALS = {
    "wordpiece": SpecialTokens("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"),
    "bpe": SpecialTokens("<pad>", "<unk>", "<s>", "</s>", "<mask>"),
    "unigram": SpecialTokens("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"),
    "sentencepiece_bpe": SpecialTokens("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"),
}

# transformers class written into tokenizer_config.json, so AutoTokenizer picks the right one.
_HF_CLASS = {
    "wordpiece": "BertTokenizer",
    "bpe": "RobertaTokenizer",
    "unigram": "AlbertTokenizer",
    # AlbertTokenizer reads spiece.model as unigram only: the generic class reads tokenizer.json.
    "sentencepiece_bpe": "PreTrainedTokenizerFast",
}


def parse_specials(kind: str, names: str | Sequence[str] = "") -> SpecialTokens:
    """Kind's default specials, or five comma-separated names in pad,unk,cls,sep,mask order."""
    if kind not in KINDS:
        raise ValueError(f"config.data.tokenizer.kind={kind!r} is not one of {KINDS}")
    if not names:
        return DEFAULT_SPECIALS[kind]
    names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
    if len(names) != 5 or not all(names) or len(set(names)) != 5:
        raise ValueError(
            f"config.data.tokenizer.special_tokens={names!r} must be five distinct names in the "
            "order pad,unk,cls,sep,mask"
        )
    return SpecialTokens(*names)


def bert_wordpiece(
    vocab: dict[str, int] | str, lowercase: bool = True, specials: SpecialTokens | None = None
) -> tokenizers.Tokenizer:
    """BERT's pipeline (normaliser, splitter, [CLS] A [SEP] B [SEP] template) on a WordPiece vocab.

    vocab: token -> id, or a vocab.txt path (local or in a bucket). specials: BERT's unless given.
    """
    specials = specials or DEFAULT_SPECIALS["wordpiece"]
    if isinstance(vocab, str):
        # As WordPiece.from_file reads it (line i is id i, trailing blanks trimmed), from any path.
        vocab = {line.rstrip(): i for i, line in enumerate(paths.path(vocab).read_text(encoding="utf-8").splitlines())}
    model = models.WordPiece(vocab, unk_token=specials.unk)
    hf = tokenizers.Tokenizer(model)
    hf.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = tokenizers.decoders.WordPiece(prefix="##")
    if hf.token_to_id(specials.cls) is not None and hf.token_to_id(specials.sep) is not None:
        add_pair_template(hf, specials)  # A vocabulary still to be trained has no [CLS] yet.
    return hf


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
            "tokenizer_class": _HF_CLASS[self.kind],
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

    def fast_tokenizer(self) -> tokenizers.Tokenizer:
        return self.hf

    def __init__(self, kind: str, hf: tokenizers.Tokenizer, specials: SpecialTokens):
        self.kind = kind
        self.hf = hf  # The library object, for pair encodings and decoding.
        self.specials = specials

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
        for token, index in self.hf.get_vocab().items():
            if self.kind == "wordpiece":
                flags_[index] = not token.startswith("##")
            else:
                flags_[index] = token.startswith(("Ġ", "▁"))
        for token in self.specials.all():
            if self.token_to_id(token) is not None:
                flags_[self.token_to_id(token)] = True
        for index in self.hf.get_added_tokens_decoder():  # specials, and whole words added (tokenizer_extension)
            flags_[index] = True
        return flags_

    def save(self, directory: str) -> None:
        paths.write_atomically(paths.path(directory) / TOKENIZER_FILE, self.hf.to_str(pretty=True))
        if self.kind == "wordpiece":
            vocab = self.hf.get_vocab()
            by_id = sorted(vocab, key=vocab.get)
            if [vocab[t] for t in by_id] != list(range(len(by_id))):
                raise ValueError(f"tokenizer ids are not contiguous from 0; cannot write {VOCAB_FILE}")
            paths.write_atomically(paths.path(directory) / VOCAB_FILE, "".join(token + "\n" for token in by_id))
            lowercase = _has_lowercase(self.hf.normalizer)
            self._write_config(directory, {"do_lower_case": lowercase})
        elif self.kind == "bpe":
            with tempfile.TemporaryDirectory() as local:  # the model writes only to local disk
                for saved in self.hf.model.save(local):  # vocab.json + merges.txt, for the slow classes.
                    paths.copy_file(saved, paths.path(directory) / paths.path(saved).name)
            self._write_config(
                directory,
                {"add_prefix_space": True, "bos_token": self.specials.cls, "eos_token": self.specials.sep},
            )
        else:  # A Unigram tokenizer.json loaded from elsewhere: the generic class reads it.
            self._write_config(directory, {"tokenizer_class": "PreTrainedTokenizerFast"})


def _has_lowercase(normalizer) -> bool:
    if normalizer is None:
        return False
    state = json.loads(normalizer.__getstate__())

    def walk(node) -> bool:
        if isinstance(node, dict):
            if node.get("type") == "Lowercase" or node.get("lowercase") is True:
                return True
            return any(walk(v) for v in node.values())
        if isinstance(node, list):
            return any(walk(v) for v in node)
        return False

    return walk(state)


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (unigram or BPE), held as its serialized proto."""

    def __init__(self, kind: str, model_proto: bytes, specials: SpecialTokens, lowercase: bool):
        self.kind = kind
        self.specials = specials
        self.lowercase = lowercase  # Applied before the model's own normalisation, as HF does.
        self._proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)

    def __getstate__(self):  # The processor is a C++ object; rebuild it from the proto.
        return {k: v for k, v in self.__dict__.items() if k != "_sp"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)

    def get_vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def token_to_id(self, token: str) -> int | None:
        index = self._sp.piece_to_id(token)
        # piece_to_id answers unk's id for unknown pieces.
        return None if index == self._sp.unk_id() and token != self._sp.id_to_piece(index) else index

    def id_to_token(self, index: int) -> str:
        return self._sp.id_to_piece(index)

    def encode_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        texts = [t.lower() for t in texts] if self.lowercase else list(texts)
        return [np.asarray(ids, np.int32) for ids in self._sp.encode(texts)]

    def word_start_flags(self) -> np.ndarray:
        sp = self._sp
        return np.array(
            [
                sp.id_to_piece(i).startswith("▁") or sp.is_control(i) or sp.is_unknown(i)
                for i in range(sp.get_piece_size())
            ],
            bool,
        )

    def save(self, directory: str) -> None:
        paths.write_atomically(paths.path(directory) / SENTENCEPIECE_FILE, self._proto)
        if self.kind == "unigram":
            # keep_accents: SentencePiece's own normalisation (in spiece.model) decides accents.
            self._write_config(directory, {"do_lower_case": self.lowercase, "keep_accents": True})
        else:
            paths.write_atomically(paths.path(directory) / TOKENIZER_FILE, self._hf_bpe().to_str(pretty=True))
            # Saying do_lower_case lets a reload rebuild the same tokenizer.json (same hash).
            self._write_config(directory, {"do_lower_case": self.lowercase})

    def fast_tokenizer(self) -> tokenizers.Tokenizer | None:
        return self._hf_bpe() if self.kind == "sentencepiece_bpe" else None

    def _hf_bpe(self) -> tokenizers.Tokenizer:
        """This SentencePiece BPE as a `tokenizers` BPE: merges ranked by the merged piece's id.

        SentencePiece numbers BPE pieces in merge order, so piece id is merge rank (the rule
        transformers' SentencePieceExtractor applies).
        """
        from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415

        model = sentencepiece_model_pb2.ModelProto.FromString(self._proto)
        # USER_DEFINED pieces (tokenizer_extension's added words, always last) are matched before the merges, as
        # SentencePiece matches them: added tokens, numbered after the model's vocabulary.
        user_defined = [p.piece for p in model.pieces if p.type == p.Type.USER_DEFINED]
        vocab = {p.piece: i for i, p in enumerate(model.pieces) if p.type != p.Type.USER_DEFINED}
        specials = set(self.specials.all())
        merges = sorted(
            (vocab[piece], vocab[piece[:k]], vocab[piece[k:]], piece[:k], piece[k:])
            for piece in vocab
            if piece not in specials
            for k in range(1, len(piece))
            if piece[:k] in vocab and piece[k:] in vocab
        )
        hf = tokenizers.Tokenizer(
            models.BPE(vocab, [(a, b) for *_, a, b in merges], unk_token=self.specials.unk, fuse_unk=True)
        )
        steps = [normalizers.Lowercase()] if self.lowercase else []
        if model.normalizer_spec.precompiled_charsmap:
            steps.append(normalizers.Precompiled(model.normalizer_spec.precompiled_charsmap))
        hf.normalizer = normalizers.Sequence(steps)
        hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        hf.decoder = tokenizers.decoders.Metaspace(replacement="▁", prepend_scheme="always")
        hf.add_special_tokens(list(self.specials.all()))
        hf.add_tokens([tokenizers.AddedToken(piece.removeprefix("▁"), single_word=True, lstrip=True, normalized=True)
                       for piece in user_defined])
        add_pair_template(hf, self.specials)
        return hf


def add_pair_template(hf: tokenizers.Tokenizer, specials: SpecialTokens) -> None:
    """[CLS] A [SEP] B [SEP], type ids 0 then 1, as BertTokenizer builds pairs."""
    cls, sep = specials.cls, specials.sep
    hf.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, hf.token_to_id(cls)), (sep, hf.token_to_id(sep))],
    )
