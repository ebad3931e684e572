"""BERT WordPiece tokenizers: training, saving in both HF formats, loading, special ids.

Usage:
  python -m data_pipelines.tokenizer --out=/tmp/tok --vocab_size=8192

trains on the training documents of the embedded corpus and writes `tokenizer.json`
(the `tokenizers` library's format) and `vocab.txt` (one token per line in id order,
what `transformers.BertTokenizer` reads).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable, Sequence

import tokenizers
from absl import app, flags, logging
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from data_pipelines import corpus

# Fixed ids 0..4: [PAD] = 0 lets padding be zeros, and every tokenizer trained here agrees.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
TOKENIZER_FILE = "tokenizer.json"
VOCAB_FILE = "vocab.txt"


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """Ids of the BERT special tokens in one vocabulary."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    def all(self) -> tuple[int, ...]:
        return (self.pad, self.unk, self.cls, self.sep, self.mask)


def special_ids(tokenizer: tokenizers.Tokenizer) -> SpecialIds:
    """Looks up the special tokens' ids; ValueError naming any token the vocabulary lacks."""
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    missing = [token for token, i in ids.items() if i is None]
    if missing:
        raise ValueError(
            f"tokenizer vocabulary lacks special token(s) {missing}; BERT needs all of "
            f"{list(SPECIAL_TOKENS)}"
        )
    return SpecialIds(*(ids[token] for token in SPECIAL_TOKENS))


def _bert_pipeline(model: models.Model) -> tokenizers.Tokenizer:
    """Wraps a WordPiece model in BERT's uncased normalisation, splitting and templates."""
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def _add_pair_template(tokenizer: tokenizers.Tokenizer) -> None:
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )


def train_wordpiece(
    texts: Iterable[str], vocab_size: int, min_frequency: int = 2
) -> tokenizers.Tokenizer:
    """Trains an uncased BERT WordPiece tokenizer; specials get ids 0..4 (SPECIAL_TOKENS)."""
    tokenizer = _bert_pipeline(models.WordPiece(unk_token="[UNK]"))
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    _add_pair_template(tokenizer)
    return tokenizer


def save_tokenizer(tokenizer: tokenizers.Tokenizer, out_dir: str) -> None:
    """Writes `tokenizer.json` and `vocab.txt` (tokens in id order) into out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    tokenizer.save(os.path.join(out_dir, TOKENIZER_FILE))
    vocab = tokenizer.get_vocab()
    by_id = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in by_id] != list(range(len(by_id))):
        raise ValueError(f"tokenizer ids are not contiguous from 0; cannot write {VOCAB_FILE}")
    with open(os.path.join(out_dir, VOCAB_FILE), "w", encoding="utf-8") as f:
        f.writelines(token + "\n" for token in by_id)


def load_tokenizer(directory: str) -> tokenizers.Tokenizer:
    """Loads `tokenizer.json` from directory, else builds a BERT tokenizer on `vocab.txt`."""
    json_path = os.path.join(directory, TOKENIZER_FILE)
    vocab_path = os.path.join(directory, VOCAB_FILE)
    if os.path.exists(json_path):
        return tokenizers.Tokenizer.from_file(json_path)
    if os.path.exists(vocab_path):
        tokenizer = _bert_pipeline(models.WordPiece.from_file(vocab_path, unk_token="[UNK]"))
        _add_pair_template(tokenizer)
        return tokenizer
    raise FileNotFoundError(f"{directory} holds neither {TOKENIZER_FILE} nor {VOCAB_FILE}")


def _define_flags():
    # Defined when the command runs rather than at import, so that importing this module
    # next to other entry points (e.g. in one console script) cannot clash on flag names.
    flags.DEFINE_string("out", None, "Directory to write tokenizer.json and vocab.txt to.")
    flags.DEFINE_integer("vocab_size", 8192, "WordPiece vocabulary size, specials included.")
    flags.DEFINE_integer("min_frequency", 2, "Minimum count for a merge to enter the vocab.")
    flags.DEFINE_float("eval_fraction", 0.05, "Share of documents held out (not trained on).")
    flags.mark_flag_as_required("out")
    return flags.FLAGS


def _train_on_embedded_corpus(argv: Sequence[str], flag_values) -> None:
    del argv
    start = time.perf_counter()
    texts = (
        " ".join(document)
        for index, document in enumerate(corpus.embedded_documents())
        if not corpus.is_eval_document(index, flag_values.eval_fraction)
    )
    tokenizer = train_wordpiece(texts, flag_values.vocab_size, flag_values.min_frequency)
    save_tokenizer(tokenizer, flag_values.out)
    logging.info(
        "Trained a %d-token WordPiece vocabulary in %.1f s; wrote %s",
        tokenizer.get_vocab_size(),
        time.perf_counter() - start,
        flag_values.out,
    )


def main() -> None:
    """Console-script entry point: trains on the embedded corpus, writes to --out."""
    flag_values = _define_flags()
    app.run(lambda argv: _train_on_embedded_corpus(argv, flag_values))


if __name__ == "__main__":
    main()
