"""Mining a domain corpus for the words its tokenizer fragments most, and counting tokens per word.

A word's worth is the tokens it would save on the corpus as one token: frequency × (pieces − 1)
(the ranking of exBERT and of Fast Vocabulary Transfer, Gee et al. 2022). The corpus streams
through once; only a count per distinct word is held.
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable

from absl import logging

from bert_jax import UserError
from data_pipelines.tokenizers import extension as tokenizer_extension
from data_pipelines.tokenizers.kinds import Tokenizer

# Segments encoded together: the tokenizers' batch calls amortise their per-call cost.
_BATCH = 256


@dataclasses.dataclass(frozen=True)
class Candidate:
    word: str
    frequency: int
    pieces: tuple[str, ...]  # the word's tokens before extension

    @property
    def saving(self) -> int:
        return self.frequency * (len(self.pieces) - 1)


@dataclasses.dataclass(frozen=True)
class CorpusCount:
    """Tokens (no specials) and whitespace-separated words of a corpus, and its distinct words' counts."""

    tokens: int
    words: int
    word_counts: collections.Counter

    @property
    def tokens_per_word(self) -> float:
        return self.tokens / max(self.words, 1)


def _batches(segments: Iterable[str]) -> Iterable[list[str]]:
    batch = []
    for segment in segments:
        batch.append(segment)
        if len(batch) == _BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def count_corpus(tokenizer: Tokenizer, segments: Iterable[str], with_words: bool = True) -> CorpusCount:
    """Streams `segments` (the corpus's lines) through `tokenizer`: token and word totals, and (with_words)
    how often each candidate word (tokenizer_extension.words_of) occurs."""
    tokens = words = 0
    counts = collections.Counter()
    for batch in _batches(segments):
        tokens += sum(len(ids) for ids in tokenizer.encode_ids(batch))
        for segment in batch:
            words += len(segment.split())
            if with_words:
                counts.update(tokenizer_extension.words_of(tokenizer, segment))
    return CorpusCount(tokens, words, counts)


def rank_candidates(tokenizer: Tokenizer, word_counts: collections.Counter) -> list[Candidate]:
    """Words of two or more pieces that are not tokens already, most tokens saved first (ties: alphabetical)."""
    words = sorted(word_counts)
    candidates = []
    for start in range(0, len(words), _BATCH):
        batch = words[start:start + _BATCH]
        for word, ids in zip(batch, tokenizer.encode_ids(batch)):
            if len(ids) >= 2 and not tokenizer_extension.in_vocabulary(tokenizer, word):
                pieces = tuple(tokenizer.id_to_token(int(i)) for i in ids)
                candidates.append(Candidate(word, word_counts[word], pieces))
    return sorted(candidates, key=lambda c: (-c.saving, c.word))


def check_choice(add: int | None, min_saving: int | None) -> None:
    """UserError naming the flag if --add / --min_saving cannot choose words."""
    if add is None and min_saving is None:
        raise UserError("give --add=N (how many words) or --min_saving=S (tokens a word must save), or both")
    if add is not None and add < 1:
        raise UserError(f"--add={add} must be at least 1")
    if min_saving is not None and min_saving < 1:
        raise UserError(f"--min_saving={min_saving} must be at least 1")


def choose(candidates: list[Candidate], add: int | None, min_saving: int | None) -> list[Candidate]:
    """The top `add` candidates, or every one saving at least `min_saving` tokens (both: the stricter).

    Fewer candidates than `add` is not an error: they are all taken, with a warning naming both numbers.
    """
    check_choice(add, min_saving)
    chosen = [c for c in candidates if min_saving is None or c.saving >= min_saving]
    if add is not None:
        if len(chosen) < add:
            logging.warning("--add=%d: the corpus yields only %d candidate word(s) (two or more pieces, not in the "
                            "vocabulary%s); adding %d", add, len(chosen),
                            f", saving >= {min_saving}" if min_saving else "", len(chosen))
        chosen = chosen[:add]
    return chosen
