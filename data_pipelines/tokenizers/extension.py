"""Adding whole words to a trained tokenizer, each word one new token, every old id kept.

New ids are appended (old size, old size + 1, ...), so a model's old embedding rows keep
their meaning. Each kind takes the words where its own algorithm reads them as one token (its
record's `extend`, in its file):

  wordpiece          appended to the WordPiece vocabulary (vocab.txt, tokenizer.json). Greedy
                     longest-match then also takes the word as the start of a longer word
                     ("acetaminophens" -> acetaminophen ##s): the report's measured count says so.
  bpe                byte-level BPE cannot build a whole word from merges without adding the
                     intermediate merges as tokens too, and those would re-cut other words; the
                     word becomes an added token of tokenizer.json instead, matched as a whole
                     word only, with the space before it absorbed (as RoBERTa's <mask>).
  unigram            the piece `▁word` is appended to the SentencePiece model with score 0:
                     scores are log-probabilities (< 0), so one piece of score 0 beats every
                     segmentation of the word into two or more, and Viterbi takes it.
  sentencepiece_bpe  the piece `▁word` is appended as a USER_DEFINED piece, which SentencePiece
                     matches before its merges (merges alone could only build it through new
                     intermediate pieces); tokenizer.json, for transformers, holds it as an added
                     token matched as unigram's is.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from data_pipelines.tokenizers.kinds import Tokenizer, get_kind
from data_pipelines.tokenizers.sentencepiece import SENTENCEPIECE_SPACE, SentencePieceTokenizer

# A word worth a token of its own: letters only (no digits, no punctuation, which every kind splits off).
_WORD = re.compile(r"^[^\W\d_]+$")


def check_extendable(tokenizer: Tokenizer, where: str) -> None:
    """ValueError naming the tokenizer's kind (and `where` it came from) if words cannot be added to it."""
    kind = get_kind(tokenizer.kind)
    if kind.extend is None or not isinstance(tokenizer, kind.extends):
        raise ValueError(f"{where}: a {type(tokenizer).__name__} of kind {tokenizer.kind!r} cannot be extended; "
                         f"extend-vocab adds words to WordPiece and byte-level BPE tokenizer.json files and to "
                         f"SentencePiece (unigram, BPE) .model files")


def words_of(tokenizer: Tokenizer, text: str) -> list[str]:
    """The words of `text` as the tokenizer splits it before its model runs, normalised as it normalises:
    the forms a new token would take. Only words of letters are returned."""
    if isinstance(tokenizer, SentencePieceTokenizer):
        units = (text.lower() if tokenizer.lowercase else text).split()
    else:
        hf = tokenizer.hf
        normalized = hf.normalizer.normalize_str(text) if hf.normalizer is not None else text
        if hf.pre_tokenizer is None:
            units = normalized.split()
        else:
            units = [unit for unit, _ in hf.pre_tokenizer.pre_tokenize_str(normalized)]
        marker = get_kind(tokenizer.kind).space_marker
        if marker:  # byte-level BPE: only a word after a space, `Ġword`; a word after `(` is cut differently
            units = [unit[len(marker):] for unit in units if unit.startswith(marker)]
    return [unit for unit in units if _WORD.match(unit)]


def token_form(tokenizer: Tokenizer, word: str) -> str:
    """The vocabulary entry `word` becomes (SentencePiece marks a word start with `▁`)."""
    return SENTENCEPIECE_SPACE + word if isinstance(tokenizer, SentencePieceTokenizer) else word


def in_vocabulary(tokenizer: Tokenizer, word: str) -> bool:
    forms = {token_form(tokenizer, word), word}
    if get_kind(tokenizer.kind).space_marker:
        forms.add(get_kind(tokenizer.kind).space_marker + word)
    return any(tokenizer.token_to_id(form) is not None for form in forms)


def extend_tokenizer(tokenizer: Tokenizer, words: Sequence[str]) -> Tokenizer:
    """A new tokenizer: `tokenizer` with `words` appended, ids old_size, old_size + 1, ... in order."""
    check_extendable(tokenizer, "the tokenizer")
    old_size = tokenizer.get_vocab_size()
    if len(set(words)) != len(words):
        raise ValueError("the words to add hold duplicates")
    known = [w for w in words if in_vocabulary(tokenizer, w)]
    if known:
        raise ValueError(f"already in the vocabulary: {known[:5]}")
    extended = get_kind(tokenizer.kind).extend(tokenizer, words, old_size)
    for offset, word in enumerate(words):
        got = extended.token_to_id(token_form(tokenizer, word))
        if got != old_size + offset:  # a guard on the library's numbering, which the embeddings rely on
            raise AssertionError(f"{word!r} got id {got}, expected {old_size + offset}")
    return extended
