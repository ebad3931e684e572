"""WordPiece, BERT's tokenizer (`config.data.tokenizer.kind=wordpiece`): [PAD] [UNK] [CLS] [SEP] [MASK] are ids 0..4,
and `##` marks a piece that continues a word. Saved as tokenizer.json and vocab.txt (BertTokenizer)."""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import tokenizers
from tokenizers import normalizers, pre_tokenizers, trainers

from bert_jax.storage import paths
from data_pipelines.tokenizers.kinds import (VOCAB_FILE, HfTokenizer, SpecialTokens, TokenizerKind,
                                             add_pair_template, register_kind)

WORDPIECE_SPECIALS = SpecialTokens("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def bert_wordpiece(
    vocab: dict[str, int] | str, lowercase: bool = True, specials: SpecialTokens | None = None
) -> tokenizers.Tokenizer:
    """BERT's pipeline (normaliser, splitter, [CLS] A [SEP] B [SEP] template) on a WordPiece vocab.

    vocab: token -> id, or a vocab.txt path (local or in a bucket). specials: BERT's unless given.
    """
    specials = specials or WORDPIECE_SPECIALS
    if isinstance(vocab, str):
        # As WordPiece.from_file reads it (line i is id i, trailing blanks trimmed), from any path.
        vocab = {line.rstrip(): i for i, line in enumerate(paths.path(vocab).read_text(encoding="utf-8").splitlines())}
    model = tokenizers.models.WordPiece(vocab, unk_token=specials.unk)
    hf = tokenizers.Tokenizer(model)
    hf.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = tokenizers.decoders.WordPiece(prefix="##")
    if hf.token_to_id(specials.cls) is not None and hf.token_to_id(specials.sep) is not None:
        add_pair_template(hf, specials)  # A vocabulary still to be trained has no [CLS] yet.
    return hf


def train_wordpiece(
    texts: Iterable[str],
    vocab_size: int,
    min_frequency: int = 2,
    *,
    lowercase: bool = True,
    specials: SpecialTokens | None = None,
) -> HfTokenizer:
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
    specials = specials or WORDPIECE_SPECIALS
    texts = list(texts)
    hf = bert_wordpiece({specials.unk: 0}, lowercase, specials)
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
    trained = bert_wordpiece({t: i for i, t in enumerate(canonical)}, lowercase, specials)
    trained.add_special_tokens(list(specials.all()))
    return HfTokenizer("wordpiece", trained, specials)


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


def _save_files(tokenizer: HfTokenizer, directory: str) -> dict:
    """vocab.txt beside tokenizer.json, for BertTokenizer (the slow class)."""
    vocab = tokenizer.hf.get_vocab()
    by_id = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in by_id] != list(range(len(by_id))):
        raise ValueError(f"tokenizer ids are not contiguous from 0; cannot write {VOCAB_FILE}")
    paths.write_atomically(paths.path(directory) / VOCAB_FILE, "".join(token + "\n" for token in by_id))
    return {"do_lower_case": _has_lowercase(tokenizer.hf.normalizer)}


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


def _extend(tokenizer: HfTokenizer, words: Sequence[str], old_size: int) -> HfTokenizer:
    """Appended to the WordPiece vocabulary (vocab.txt, tokenizer.json)."""
    spec = json.loads(tokenizer.hf.to_str())
    for offset, word in enumerate(words):
        spec["model"]["vocab"][word] = old_size + offset
    return HfTokenizer(tokenizer.kind, tokenizers.Tokenizer.from_str(json.dumps(spec)), tokenizer.specials)


WORDPIECE = register_kind(TokenizerKind(
    name="wordpiece", specials=WORDPIECE_SPECIALS, hf_class="BertTokenizer", train=train_wordpiece,
    hf_model="WordPiece", vocab_file=lambda path, lowercase: bert_wordpiece(path, lowercase),
    word_start=lambda token: not token.startswith("##"), save_files=_save_files,
    extend=_extend, extends=HfTokenizer))
