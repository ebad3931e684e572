"""Tokenizers: one object over WordPiece, byte-level BPE and SentencePiece; load, save, specials.

Usage:
  python -m data_pipelines.tokenizer --config=configs/tiny.py --out=/tmp/tok \
      [--config.data.tokenizer.kind=unigram] [--config.data.source=text --config.data.path=...]

trains the configured kind on a `data.tokenizer.sample_bytes`-capped sample of the source's
training documents (`tokenizer_training.py`) and saves it. Without --config it trains
WordPiece on the embedded corpus (`--vocab_size`, `--min_frequency`, `--eval_fraction`).

Kinds and their special tokens (`SpecialIds` names them pad/unk/cls/sep/mask):
  wordpiece          BERT: [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0..4); `##` marks continuations.
  bpe                RoBERTa byte-level BPE: <s> <pad> </s> <unk> <mask> (ids 0..4, RoBERTa's
                     order); `Ġ` marks a word start.
  unigram            ALBERT SentencePiece unigram: <pad> <unk> [CLS] [SEP] [MASK] (ids 0..4);
  sentencepiece_bpe  the same with SentencePiece BPE; `▁` marks a word start.

`save(dir)` writes what Hugging Face `AutoTokenizer.from_pretrained(dir)` loads:
wordpiece -> tokenizer.json + vocab.txt; bpe -> tokenizer.json + vocab.json + merges.txt;
unigram -> spiece.model; sentencepiece_bpe -> spiece.model + tokenizer.json (AlbertTokenizer
reads spiece.model as unigram only); each with a tokenizer_config.json naming the class
and the specials.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import time
from collections.abc import Iterable, Sequence

import ml_collections
import numpy as np
import sentencepiece as spm
import tokenizers
from absl import app, flags, logging
from tokenizers import models, normalizers, pre_tokenizers, processors

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
# Kept for callers of the BERT-only module this replaces.
SPECIAL_TOKENS = DEFAULT_SPECIALS["wordpiece"].all()

# transformers class written into tokenizer_config.json, so AutoTokenizer picks the right one.
_HF_CLASS = {
    "wordpiece": "BertTokenizer",
    "bpe": "RobertaTokenizer",
    "unigram": "AlbertTokenizer",
    "sentencepiece_bpe": "AlbertTokenizer",
}


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """Ids of the special tokens in one vocabulary (for RoBERTa cls/sep are <s>/</s>)."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    def all(self) -> tuple[int, ...]:
        return (self.pad, self.unk, self.cls, self.sep, self.mask)


class Tokenizer:
    """What the data pipeline needs of any tokenizer kind; subclasses hold the library object."""

    kind: str
    specials: SpecialTokens

    def get_vocab_size(self) -> int:
        raise NotImplementedError

    def token_to_id(self, token: str) -> int | None:
        raise NotImplementedError

    def id_to_token(self, index: int) -> str:
        raise NotImplementedError

    def encode_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Tokenizes each text without special tokens: one [num_tokens] int32 array per text."""
        raise NotImplementedError

    def word_start_flags(self) -> np.ndarray:
        """[vocab_size] bool: True where a token begins a word (whole-word / span masking).

        A WordPiece token begins a word unless it starts with `##`; a SentencePiece or
        byte-level BPE token begins one when it starts with `▁` / `Ġ`. Specials count as
        word starts, so a masked word never swallows them.
        """
        raise NotImplementedError

    def save(self, directory: str) -> None:
        raise NotImplementedError

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
        with open(os.path.join(directory, CONFIG_FILE), "w", encoding="utf-8") as f:
            json.dump(self._config_json(extra), f, indent=2)


class HfTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` (WordPiece or byte-level BPE; also a loaded Unigram JSON)."""

    def __init__(self, kind: str, hf: tokenizers.Tokenizer, specials: SpecialTokens):
        self.kind = kind
        self.hf = hf  # The library object, for pair encodings and decoding.
        self.specials = specials

    def __getattr__(self, name):
        # Everything else (encode with pairs, decode, get_vocab) is the library object's.
        if name == "hf":
            raise AttributeError(name)
        return getattr(self.hf, name)

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
        return flags_

    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.hf.save(os.path.join(directory, TOKENIZER_FILE))
        if self.kind == "wordpiece":
            vocab = self.hf.get_vocab()
            by_id = sorted(vocab, key=vocab.get)
            if [vocab[t] for t in by_id] != list(range(len(by_id))):
                raise ValueError(f"tokenizer ids are not contiguous from 0; cannot write {VOCAB_FILE}")
            with open(os.path.join(directory, VOCAB_FILE), "w", encoding="utf-8") as f:
                f.writelines(token + "\n" for token in by_id)
            lowercase = _has_lowercase(self.hf.normalizer)
            self._write_config(directory, {"do_lower_case": lowercase})
        elif self.kind == "bpe":
            self.hf.model.save(directory)  # vocab.json + merges.txt, for the slow classes.
            self._write_config(
                directory,
                {"add_prefix_space": True, "bos_token": self.specials.cls, "eos_token": self.specials.sep},
            )
        else:
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
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, SENTENCEPIECE_FILE), "wb") as f:
            f.write(self._proto)
        if self.kind == "unigram":
            # keep_accents: SentencePiece's own normalisation (in spiece.model) decides accents.
            self._write_config(directory, {"do_lower_case": self.lowercase, "keep_accents": True})
        else:
            # transformers' AlbertTokenizer reads spiece.model as unigram only: give it the
            # same BPE as a tokenizer.json for the generic fast class.
            self._hf_bpe().save(os.path.join(directory, TOKENIZER_FILE))
            self._write_config(directory, {"tokenizer_class": "PreTrainedTokenizerFast"})

    def _hf_bpe(self) -> tokenizers.Tokenizer:
        """This SentencePiece BPE as a `tokenizers` BPE: merges ranked by the merged piece's id.

        SentencePiece numbers BPE pieces in merge order, so piece id is merge rank (the rule
        transformers' SentencePieceExtractor applies).
        """
        from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415

        model = sentencepiece_model_pb2.ModelProto.FromString(self._proto)
        vocab = {p.piece: i for i, p in enumerate(model.pieces)}
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
        add_pair_template(hf, self.specials)
        return hf


def special_ids(tokenizer) -> SpecialIds:
    """Looks up the special tokens' ids; ValueError naming any token the vocabulary lacks.

    Accepts a `Tokenizer` (its kind's specials) or a bare `tokenizers.Tokenizer` (BERT's).
    """
    specials = getattr(tokenizer, "specials", DEFAULT_SPECIALS["wordpiece"])
    ids = {token: tokenizer.token_to_id(token) for token in specials.all()}
    missing = [token for token, i in ids.items() if i is None]
    if missing:
        raise ValueError(
            f"tokenizer vocabulary lacks special token(s) {missing}; it needs all of "
            f"{list(specials.all())} (config.data.tokenizer.special_tokens)"
        )
    return SpecialIds(*(ids[token] for token in specials.all()))


def save_tokenizer(tokenizer: Tokenizer, out_dir: str) -> None:
    """Writes the tokenizer's Hugging Face files into out_dir (see the module docstring)."""
    tokenizer.save(out_dir)


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


def _read_config(directory: str) -> dict:
    path = os.path.join(directory, CONFIG_FILE)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _specials_from_config(kind: str, config: dict) -> SpecialTokens:
    default = DEFAULT_SPECIALS[kind]
    return SpecialTokens(
        *(config.get(f"{field}_token", getattr(default, field)) for field in ("pad", "unk", "cls", "sep", "mask"))
    )


def _hf_kind(hf: tokenizers.Tokenizer) -> str:
    model = json.loads(hf.to_str())["model"]["type"]
    return {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram"}.get(model, "")


def bert_wordpiece(vocab: dict[str, int] | str, lowercase: bool = True) -> tokenizers.Tokenizer:
    """BERT's pipeline (normaliser, splitter, [CLS] A [SEP] B [SEP] template) on a WordPiece vocab.

    vocab: token -> id, or a vocab.txt path.
    """
    specials = DEFAULT_SPECIALS["wordpiece"]
    if isinstance(vocab, str):
        model = models.WordPiece.from_file(vocab, unk_token=specials.unk)
    else:
        model = models.WordPiece(vocab, unk_token=specials.unk)
    hf = tokenizers.Tokenizer(model)
    hf.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = tokenizers.decoders.WordPiece(prefix="##")
    add_pair_template(hf, specials)
    return hf


def add_pair_template(hf: tokenizers.Tokenizer, specials: SpecialTokens) -> None:
    """[CLS] A [SEP] B [SEP], type ids 0 then 1, as BertTokenizer builds pairs."""
    cls, sep = specials.cls, specials.sep
    hf.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, hf.token_to_id(cls)), (sep, hf.token_to_id(sep))],
    )


def load_tokenizer(path: str, lowercase: bool | None = None) -> Tokenizer:
    """Loads a tokenizer from a directory or a file (tokenizer.json, vocab.txt, *.model).

    In a directory, a SentencePiece .model wins over tokenizer.json (saved beside it for
    Hugging Face), which wins over vocab.txt. `lowercase` applies where the files do not say (vocab.txt, a bare .model);
    None means the file's tokenizer_config.json, else lowercase for vocab.txt (BERT uncased)
    and not for a .model.
    """
    if os.path.isdir(path):
        config = _read_config(path)
        models_found = sorted(glob.glob(os.path.join(path, "*.model")))
        for candidate in (*models_found, os.path.join(path, TOKENIZER_FILE), os.path.join(path, VOCAB_FILE)):
            if os.path.exists(candidate):
                return _load_file(candidate, lowercase, config)
        raise FileNotFoundError(
            f"{path} holds neither {TOKENIZER_FILE} nor {VOCAB_FILE} nor a SentencePiece .model "
            "(config.data.tokenizer.path)"
        )
    if not os.path.exists(path):
        raise FileNotFoundError(f"config.data.tokenizer.path={path!r} does not exist")
    return _load_file(path, lowercase, _read_config(os.path.dirname(path) or "."))


def _load_file(path: str, lowercase: bool | None, config: dict) -> Tokenizer:
    name = os.path.basename(path)
    if name.endswith(".json"):
        hf = tokenizers.Tokenizer.from_file(path)
        kind = _hf_kind(hf)
        if not kind:
            raise ValueError(f"{path}: unsupported tokenizers model; need WordPiece, BPE or Unigram")
        return HfTokenizer(kind, hf, _specials_from_config(kind, config))
    if name.endswith(".model"):
        with open(path, "rb") as f:
            proto = f.read()
        sp = spm.SentencePieceProcessor(model_proto=proto)
        from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415 (protobuf; only here)

        model = sentencepiece_model_pb2.ModelProto.FromString(proto)
        kind = "sentencepiece_bpe" if model.trainer_spec.model_type == model.trainer_spec.BPE else "unigram"
        del sp
        if lowercase is None:
            lowercase = bool(config.get("do_lower_case", False))
        return SentencePieceTokenizer(kind, proto, _specials_from_config(kind, config), lowercase)
    if name.endswith(".txt"):
        if lowercase is None:
            lowercase = bool(config.get("do_lower_case", True))
        hf = bert_wordpiece(path, lowercase)
        return HfTokenizer("wordpiece", hf, _specials_from_config("wordpiece", config))
    raise ValueError(
        f"config.data.tokenizer.path={path!r}: expected tokenizer.json, vocab.txt or a .model file"
    )


def has_tokenizer(directory: str) -> bool:
    return os.path.isdir(directory) and any(
        os.path.exists(os.path.join(directory, f)) for f in (TOKENIZER_FILE, VOCAB_FILE, SENTENCEPIECE_FILE)
    ) or bool(glob.glob(os.path.join(directory, "*.model")))


def prepare_tokenizer(data_cfg: ml_collections.ConfigDict, tokenizer_dir: str) -> Tokenizer:
    """The run's tokenizer, saved in tokenizer_dir: loaded if there, else obtained and saved.

    Obtained, in order: from the prepared shards' own tokenizer (source "prepared"), from
    `data.tokenizer.path`, or trained on a `sample_bytes`-capped sample of the train split.
    Trainers break frequency ties in hash-map order, so two trainings on the same text may
    differ in a few entries: a run therefore trains once, saves, and every resume (or
    other host) loads the saved one.
    """
    tok_cfg = data_cfg.get("tokenizer") or ml_collections.ConfigDict()
    if has_tokenizer(tokenizer_dir):
        tokenizer = load_tokenizer(tokenizer_dir)
    else:
        if data_cfg.source == "prepared":
            tokenizer = load_tokenizer(os.path.join(data_cfg.path, "tokenizer"))
        elif tok_cfg.get("path", ""):
            tokenizer = load_tokenizer(tok_cfg.path, tok_cfg.get("lowercase", None))
        else:
            from data_pipelines import tokenizer_training  # noqa: PLC0415 (imports the sources)

            tokenizer = tokenizer_training.train_from_config(data_cfg)
        tokenizer.save(tokenizer_dir)
        if os.path.isdir(tokenizer_dir):
            # Saved files are what resumes and other hosts load: use them from the start.
            tokenizer = load_tokenizer(tokenizer_dir)
    special_ids(tokenizer)  # Fails early, naming a missing special token.
    return tokenizer


def train_wordpiece(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
    """BERT uncased WordPiece trained on texts (see tokenizer_training.train_wordpiece)."""
    from data_pipelines import tokenizer_training  # noqa: PLC0415 (it imports this module)

    return tokenizer_training.train_wordpiece(texts, vocab_size, min_frequency)


def copy_tokenizer(src_dir: str, dst_dir: str) -> None:
    """Copies a saved tokenizer's files (prepare puts one next to its shards)."""
    os.makedirs(dst_dir, exist_ok=True)
    for name in os.listdir(src_dir):
        shutil.copy2(os.path.join(src_dir, name), os.path.join(dst_dir, name))


def _define_flags():
    # Defined when the command runs rather than at import, so that importing this module
    # next to other entry points (e.g. in one console script) cannot clash on flag names.
    from ml_collections import config_flags  # noqa: PLC0415

    config_flags.DEFINE_config_file("config", None, "Config whose data block says what to train.")
    flags.DEFINE_string("out", None, "Directory to write the tokenizer files to.")
    flags.DEFINE_integer("vocab_size", 8192, "Without --config: WordPiece vocabulary size.")
    flags.DEFINE_integer("min_frequency", 2, "Without --config: minimum count to enter the vocab.")
    flags.DEFINE_float("eval_fraction", 0.05, "Without --config: share of documents held out.")
    flags.mark_flag_as_required("out")
    return flags.FLAGS


def _run(argv: Sequence[str], flag_values) -> None:
    del argv
    from data_pipelines import corpus, tokenizer_training  # noqa: PLC0415

    start = time.perf_counter()
    if flag_values.config is not None:
        tokenizer = tokenizer_training.train_from_config(flag_values.config.data)
    else:
        texts: Iterable[str] = (
            " ".join(document)
            for index, document in enumerate(corpus.embedded_documents())
            if not corpus.is_eval_document(index, flag_values.eval_fraction)
        )
        tokenizer = tokenizer_training.train_wordpiece(
            texts, flag_values.vocab_size, flag_values.min_frequency
        )
    tokenizer.save(flag_values.out)
    logging.info(
        "Trained a %d-token %s tokenizer in %.1f s; wrote %s",
        tokenizer.get_vocab_size(),
        tokenizer.kind,
        time.perf_counter() - start,
        flag_values.out,
    )


def main() -> None:
    """Console-script entry point."""
    flag_values = _define_flags()
    app.run(lambda argv: _run(argv, flag_values))


if __name__ == "__main__":
    main()
