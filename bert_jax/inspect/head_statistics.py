"""What each attention head looks at, as Clark et al. (2019, "What Does BERT Look At?", §3) measured it.

For one sentence of n tokens and one head with attention probabilities p[query, key]:

    cls, sep, punctuation   sum over queries and the keys of that kind of p, / n: the attention mass a token
                            sends to [CLS], to [SEP], to punctuation, on average over the sentence's tokens
    previous, next, self    sum_i p[i, i-1] / n, sum_i p[i, i+1] / n, sum_i p[i, i] / n (the first token has no
                            previous and the last no next: both still count in n, as in the paper's notebook)
    entropy                 the mean over queries of -sum_k p[i, k] log p[i, k], in nats (0 log 0 = 0; the paper's
                            notebook smooths p by 1e-4 instead, which shifts a sharp head's entropy by about 1e-3)

Each statistic of a corpus is the mean over its sentences (each sentence weighs the same, however long), as
clarkkev/attention-analysis's General_Analysis.ipynb averages them. A batch is padded: padded queries are left
out and padded keys hold probability 0, so a sentence's figures do not depend on what it was batched with.
"""
from __future__ import annotations

import dataclasses
import unicodedata

import numpy as np

# name -> what it is, for tables and figure titles (in this order everywhere)
STATISTICS = {
    "cls": "attention to [CLS]",
    "sep": "attention to [SEP]",
    "punctuation": "attention to punctuation",
    "previous": "attention to the previous token",
    "next": "attention to the next token",
    "self": "attention to the token itself",
    "entropy": "entropy (nats)",
}
# What a subword tokenizer puts before a piece: WordPiece's continuation, byte-level BPE's and SentencePiece's space.
PIECE_MARKERS = ("##", "\u0120", "\u2581")


def is_punctuation(token: str) -> bool:
    """Whether a vocabulary entry is punctuation alone ("." "," "##," "\u0120." ...): every character of it, its
    subword marker aside, is in a Unicode punctuation category (P*). The paper counted "." and "," (its notebook);
    this counts every punctuation mark, in any tokenizer's spelling."""
    for marker in PIECE_MARKERS:
        token = token.removeprefix(marker)
    return bool(token) and all(unicodedata.category(ch).startswith("P") for ch in token)


def sentence_statistics(probs: np.ndarray, lengths: np.ndarray, cls: np.ndarray, sep: np.ndarray,
                        punctuation: np.ndarray) -> dict[str, np.ndarray]:
    """Each statistic of each sentence of a padded batch, {name: [batch, layers, heads] float64}.

    probs: [batch, layers, heads, length, length] (query, key); lengths: [batch] tokens of each sentence (its first
    lengths[b] positions); cls, sep, punctuation: [batch, length] bool, which keys are of that kind.
    """
    probs = np.asarray(probs, np.float64)
    length = probs.shape[-1]
    positions = np.arange(length)
    real = positions[None, :] < np.asarray(lengths)[:, None]  # [batch, length]
    queries = real[:, None, None, :, None]  # padded queries' rows count for nothing
    p = np.where(queries & real[:, None, None, None, :], probs, 0.0)
    n = np.asarray(lengths, np.float64)[:, None, None]

    def to_keys(kind: np.ndarray) -> np.ndarray:
        return np.einsum("blhqk,bk->blh", p, (np.asarray(kind) & real).astype(np.float64)) / n

    def diagonal(offset: int) -> np.ndarray:
        return np.diagonal(p, offset=offset, axis1=-2, axis2=-1).sum(-1) / n

    return {
        "cls": to_keys(cls),
        "sep": to_keys(sep),
        "punctuation": to_keys(punctuation),
        "previous": diagonal(-1),  # p[i, i-1]
        "next": diagonal(1),  # p[i, i+1]
        "self": diagonal(0),
        "entropy": -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1).sum(-1) / n,  # 0 log 0 = 0
    }


@dataclasses.dataclass
class HeadStatistics:
    """The corpus means, accumulated a batch at a time: `add` each batch's sentence_statistics, read `means`."""
    sums: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    sentences: int = 0

    def add(self, per_sentence: dict[str, np.ndarray]) -> None:
        for name, values in per_sentence.items():
            total = values.sum(0)
            self.sums[name] = self.sums[name] + total if name in self.sums else total
        self.sentences += len(next(iter(per_sentence.values())))

    def means(self) -> dict[str, np.ndarray]:
        """{name: [layers, heads]}, in STATISTICS order."""
        if not self.sentences:
            raise ValueError("no sentence was measured")
        return {name: self.sums[name] / self.sentences for name in STATISTICS}
