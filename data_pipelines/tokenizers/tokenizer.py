"""Tokenizers: one object over WordPiece, byte-level BPE and SentencePiece; load, save, specials.

The command that trains one is `python -m bert_jax.commands.tokenizer` (bert_jax/commands/tokenizer.py);
the sample and its record are training.py's; each kind is a file of its own (wordpiece.py, byte_bpe.py,
sentencepiece.py) registered in kinds.py.

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
import hashlib
import json

import ml_collections
import tokenizers

from bert_jax.storage import paths
from data_pipelines.sources import documents as sources, mixture
from data_pipelines.tokenizers.kinds import (  # noqa: F401 (the module's public names)
    CONFIG_FILE,
    TOKENIZER_FILE,
    VOCAB_FILE,
    HfTokenizer,
    SpecialTokens,
    Tokenizer,
    get_kind,
    known_kinds,
    parse_specials,
)
from data_pipelines.tokenizers.sentencepiece import SentencePieceTokenizer

# What a trained tokenizer was trained on (tokenizer_training.SampleRecord), beside its files.
SAMPLE_FILE = "sample.json"


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


def special_ids(tokenizer) -> SpecialIds:
    """Looks up the special tokens' ids; ValueError naming any token the vocabulary lacks.

    Accepts a `Tokenizer` (its kind's specials) or a bare `tokenizers.Tokenizer` (BERT's).
    """
    specials = getattr(tokenizer, "specials", None) or get_kind("wordpiece").specials  # BERT's, for a bare object
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


def tokenizer_hash(directory: str) -> str:
    """sha256 over a saved tokenizer's files (names and bytes, by name), its sample record left out.

    Equal hashes mean the same vocabulary, ids and settings; two runs that tokenized with
    tokenizers of equal hash saw the same token ids.
    """
    digest = hashlib.sha256()
    files = sorted(p for p in paths.path(directory).iterdir() if p.is_file() and p.name != SAMPLE_FILE)
    if not files:
        raise FileNotFoundError(f"{directory} holds no tokenizer files to hash")
    for path in files:
        digest.update(path.name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def write_sample_record(directory: str, record: dict) -> None:
    (paths.path(directory) / SAMPLE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _read_config(directory: str) -> dict:
    path = paths.path(directory) / CONFIG_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _specials_from_config(kind: str, config: dict) -> SpecialTokens:
    default = get_kind(kind).specials
    return SpecialTokens(
        *(config.get(f"{field}_token", getattr(default, field)) for field in ("pad", "unk", "cls", "sep", "mask"))
    )


def _hf_kind(hf: tokenizers.Tokenizer) -> str:
    """The kind whose tokenizer.json has this `tokenizers` model (WordPiece, BPE, Unigram); "" if none."""
    model = json.loads(hf.to_str())["model"]["type"]
    return next((name for name in known_kinds() if get_kind(name).hf_model == model), "")


def _sentencepiece_kind(model) -> str:
    """The kind of a SentencePiece model proto; its other model types (word, char) score pieces as unigram does."""
    by_type = {get_kind(name).sentencepiece_model: name for name in known_kinds() if get_kind(name).sentencepiece_model}
    return by_type.get(model.trainer_spec.ModelType.Name(model.trainer_spec.model_type), by_type["UNIGRAM"])


def load_tokenizer(path: str, lowercase: bool | None = None) -> Tokenizer:
    """Loads a tokenizer from a directory or a file (tokenizer.json, vocab.txt, *.model).

    In a directory, a SentencePiece .model wins over tokenizer.json (saved beside it for
    Hugging Face), which wins over vocab.txt. `lowercase` applies where the files do not say (vocab.txt, a bare .model);
    None means the file's tokenizer_config.json, else lowercase for vocab.txt (BERT uncased)
    and not for a .model.
    """
    folder = paths.path(path)
    if folder.is_dir():
        config = _read_config(path)
        models_found = sorted(str(m) for m in folder.glob("*.model"))
        for candidate in (*models_found, str(folder / TOKENIZER_FILE), str(folder / VOCAB_FILE)):
            if paths.path(candidate).exists():
                return _load_file(candidate, lowercase, config)
        raise FileNotFoundError(
            f"{path} holds neither {TOKENIZER_FILE} nor {VOCAB_FILE} nor a SentencePiece .model "
            "(config.data.tokenizer.path)"
        )
    if not folder.exists():
        raise FileNotFoundError(f"config.data.tokenizer.path={path!r} does not exist")
    return _load_file(path, lowercase, _read_config(str(folder.parent)))


def _load_file(path: str, lowercase: bool | None, config: dict) -> Tokenizer:
    name = paths.path(path).name
    if name.endswith(".json"):
        hf = tokenizers.Tokenizer.from_str(paths.path(path).read_text(encoding="utf-8"))
        # A released tokenizer.json may pad and truncate every text (all-MiniLM-L6-v2's: to 128); the
        # pipeline makes its own sequences, so texts must come back whole and unpadded.
        hf.no_padding()
        hf.no_truncation()
        kind = _hf_kind(hf)
        if not kind:
            raise ValueError(f"{path}: unsupported tokenizers model; need WordPiece, BPE or Unigram")
        return HfTokenizer(kind, hf, _specials_from_config(kind, config))
    if name.endswith(".model"):
        proto = paths.path(path).read_bytes()
        from sentencepiece import sentencepiece_model_pb2  # noqa: PLC0415 (protobuf; only here)

        model = sentencepiece_model_pb2.ModelProto.FromString(proto)
        kind = _sentencepiece_kind(model)
        if lowercase is None:
            lowercase = bool(config.get("do_lower_case", False))
        return SentencePieceTokenizer(kind, proto, _specials_from_config(kind, config), lowercase)
    if name.endswith(".txt"):
        if lowercase is None:
            lowercase = bool(config.get("do_lower_case", True))
        kind = next(get_kind(name) for name in known_kinds() if get_kind(name).vocab_file)
        return HfTokenizer(kind.name, kind.vocab_file(path, lowercase), _specials_from_config(kind.name, config))
    raise ValueError(
        f"config.data.tokenizer.path={path!r}: expected tokenizer.json, vocab.txt or a .model file"
    )


def has_tokenizer(directory: str) -> bool:
    """Whether directory holds files load_tokenizer reads (tokenizer.json, vocab.txt, *.model)."""
    folder = paths.path(directory)
    if not folder.is_dir():
        return False
    named = any((folder / f).exists() for f in (TOKENIZER_FILE, VOCAB_FILE))
    return named or any(folder.glob("*.model"))


def prepare_tokenizer(data_cfg: ml_collections.ConfigDict, tokenizer_dir: str) -> Tokenizer:
    """The run's tokenizer, saved in tokenizer_dir: loaded if there, else obtained and saved.

    Obtained, in order: from the prepared shards' own tokenizer (source "prepared"), from
    `data.tokenizer.path`, or trained on a `sample_bytes`-capped sample of the train split
    (deterministic: tokenizer_training.py), with the sample's record in SAMPLE_FILE. Training
    costs time, so a run trains once and every resume (or other host) loads the saved files.
    """
    tok_cfg = data_cfg.get("tokenizer") or ml_collections.ConfigDict()
    sample_record = source_dir = None
    prepared = _prepared_sources(data_cfg)
    if has_tokenizer(tokenizer_dir):
        tokenizer = load_tokenizer(tokenizer_dir)
    else:
        if prepared:
            _, _, source_dir = prepared[0]
            tokenizer = load_tokenizer(source_dir)
        elif tok_cfg.get("path", ""):
            source_dir = tok_cfg.path
            tokenizer = load_tokenizer(tok_cfg.path, tok_cfg.get("lowercase", None))
        else:
            from data_pipelines.tokenizers import training as tokenizer_training  # noqa: PLC0415 (imports the sources)

            tokenizer, record = tokenizer_training.train_from_config(data_cfg)
            sample_record = record.to_json()
        if source_dir and (paths.path(source_dir) / SAMPLE_FILE).exists():
            # A given tokenizer's record goes with it (a sweep's shared one, prepare's).
            sample_record = json.loads((paths.path(source_dir) / SAMPLE_FILE).read_text())
        tokenizer.save(tokenizer_dir)
        if sample_record:
            write_sample_record(tokenizer_dir, sample_record)
        if paths.path(tokenizer_dir).is_dir():
            # Saved files are what resumes and other hosts load: use them from the start.
            tokenizer = load_tokenizer(tokenizer_dir)
    special_ids(tokenizer)  # Fails early, naming a missing special token.
    for key, path, bundled in prepared if mixture.has_mixture(data_cfg) else ():
        if _pieces(load_tokenizer(bundled)) != _pieces(tokenizer):
            raise ValueError(
                f"{key}={path!r} was prepared with another tokenizer than the run's ({tokenizer_dir}): "
                "a mixture's prepared sources share one tokenizer; prepare them all with "
                "--config.data.tokenizer.path set to the same tokenizer")
    return tokenizer


def _pieces(tokenizer: Tokenizer) -> list[str]:
    return [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]


def _prepared_sources(data_cfg) -> list[tuple[str, str, str]]:
    """(config key of its path, the path, the tokenizer it was tokenized with) of each tokenized source:
    config.data's own, or a mixture's (by name)."""
    if mixture.has_mixture(data_cfg):
        named = [(f"config.data.mixture.{name}", cfg) for name, cfg in mixture.source_configs(data_cfg).items()]
    else:
        named = [("config.data", data_cfg)]
    bundled = [(f"{key}.path", cfg.get("path", ""), sources.source_of(cfg, f"{key}.source").bundled_tokenizer())
               for key, cfg in named]
    return [(key, path, folder) for key, path, folder in bundled if folder]


def copy_tokenizer(src_dir: str, dst_dir: str) -> None:
    """Copies a saved tokenizer's files (prepare puts one next to its shards)."""
    for src in paths.path(src_dir).iterdir():
        paths.copy_file(src, paths.path(dst_dir) / src.name)
