"""BERT's masked-LM corruption of one example, in numpy, driven by an explicit Generator.

Masking is applied each time an example is read (dynamic masking, Liu et al. 2019 §4.1),
so it is a pure function of (input_ids, rng): the pipeline derives `rng` from the seed
and the example's position in the stream, which makes a resumed run mask identically.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from data_pipelines.tokenizer import SpecialIds

# Of the selected positions: 80% become [MASK], 10% a random token, 10% stay unchanged
# (Devlin et al. 2019, §3.1 and Appendix C.2).
MASK_TOKEN_SHARE = 0.8
RANDOM_TOKEN_SHARE = 0.1


def num_predictions(num_candidates: int, mask_rate: float, max_predictions_per_seq: int) -> int:
    """How many positions BERT predicts: rate x candidates, rounded, at least 1, capped."""
    if num_candidates == 0:
        return 0
    return min(max_predictions_per_seq, max(1, int(round(num_candidates * mask_rate))))


def random_non_special_ids(
    rng: np.random.Generator, size: int, vocab_size: int, special: Iterable[int]
) -> np.ndarray:
    """Draws `size` ids uniformly from [0, vocab_size) minus the special ids.

    Draws among the vocab_size - len(special) ordinary ids, then shifts each draw past
    every special id at or below it (visiting specials in increasing order).
    """
    specials = sorted(set(special))
    ids = rng.integers(0, vocab_size - len(specials), size=size)
    for s in specials:
        ids += ids >= s
    return ids


def mask_example(
    input_ids: np.ndarray,
    rng: np.random.Generator,
    *,
    special_ids: SpecialIds,
    vocab_size: int,
    mask_rate: float = 0.15,
    max_predictions_per_seq: int,
) -> dict[str, np.ndarray]:
    """Selects positions to predict and corrupts them, as in BERT pre-training.

    Args:
      input_ids: [L] int token ids, padded; positions holding a special id
        ([CLS], [SEP], [PAD], ...) are never selected.
      rng: the only source of randomness.
      special_ids: the vocabulary's specials: never selected nor drawn as random
        replacements; selected positions mostly become `special_ids.mask`.
      vocab_size: random replacements are drawn from [0, vocab_size).
      mask_rate: share of candidate positions selected.
      max_predictions_per_seq: P, the cap on selected positions and the padded length.

    Returns:
      input_ids: [L] int32, the corrupted sequence.
      masked_positions: [P] int32, selected positions in increasing order, then 0s.
      masked_ids: [P] int32, the original ids there, then 0s.
      masked_weights: [P] float32, 1.0 for a real prediction, 0.0 for padding.
    """
    input_ids = np.asarray(input_ids)
    is_special = (input_ids[:, None] == np.array(special_ids.all())).any(axis=1)
    candidates = np.flatnonzero(~is_special)
    n = num_predictions(candidates.size, mask_rate, max_predictions_per_seq)
    # A uniform subset of n candidates: the n smallest of i.i.d. uniform keys.
    keys = rng.random(candidates.size)
    chosen = np.argpartition(keys, n - 1)[:n] if 0 < n < candidates.size else keys.argsort()[:n]
    positions = np.sort(candidates[chosen])
    originals = input_ids[positions]

    corruption = rng.random(n)
    replacement = originals.copy()
    replacement[corruption < MASK_TOKEN_SHARE] = special_ids.mask
    use_random = (corruption >= MASK_TOKEN_SHARE) & (
        corruption < MASK_TOKEN_SHARE + RANDOM_TOKEN_SHARE
    )
    replacement[use_random] = random_non_special_ids(
        rng, int(use_random.sum()), vocab_size, special_ids.all()
    )

    masked = input_ids.astype(np.int32, copy=True)
    masked[positions] = replacement
    masked_positions = np.zeros(max_predictions_per_seq, np.int32)
    masked_ids = np.zeros(max_predictions_per_seq, np.int32)
    masked_weights = np.zeros(max_predictions_per_seq, np.float32)
    masked_positions[:n] = positions
    masked_ids[:n] = originals
    masked_weights[:n] = 1.0
    return {
        "input_ids": masked,
        "masked_positions": masked_positions,
        "masked_ids": masked_ids,
        "masked_weights": masked_weights,
    }
