"""New token rows in a Hugging Face state dict: every tensor indexed by token id grows by one row per new token.

Fast Vocabulary Transfer (Gee et al. 2022; exBERT, Tai et al. 2020): a new word's row is the mean
of the rows of the pieces the old tokenizer cut it into, so the model starts from what it knew of
the word. Applied alike to the word embeddings, the tied decoder and the MLM output bias, which keeps
the decoder tied and a new word's logit the mean of its pieces'. Old rows are copied untouched.
Pure functions on numpy arrays; which tensors are indexed by token id is each converter's
`HfConverter.vocab_tensors` (bert_jax/hf/*.py).
"""
from collections.abc import Sequence

import numpy as np

# fvt: the mean of the word's old pieces' rows; random: embedding rows drawn as a fresh model's
# (normal, std initializer_range) and bias entries 0; mean_of_all: the mean of every old row.
INITS = ("fvt", "random", "mean_of_all")


def vocab_tensors(family) -> dict[str, tuple[str, ...]]:
    """{folder ("" the main one, or a subfolder such as `generator`): HF names of its token-indexed tensors}."""
    if family.hf is None or not family.hf.vocab_tensors:
        raise ValueError(f"model family {family.name!r} declares no token-indexed tensors (VOCAB_TENSORS in its "
                         f"Hugging Face converter): its vocabulary cannot be extended")
    return family.hf.vocab_tensors


def _new_rows(table: np.ndarray, pieces: Sequence[Sequence[int]], init: str, seed: int,
              initializer_range: float) -> np.ndarray:
    if init == "fvt":
        return np.stack([table[np.asarray(ids)].mean(axis=0, dtype=np.float64) for ids in pieces]).astype(table.dtype)
    if init == "mean_of_all":
        return np.repeat(table.mean(axis=0, dtype=np.float64)[None], len(pieces), axis=0).astype(table.dtype)
    if init == "random":
        if table.ndim == 1:  # a bias: a fresh model's is 0
            return np.zeros((len(pieces),), table.dtype)
        # Seeded by the row width alone, so tied tables (a decoder, ELECTRA's two copies) draw the same rows.
        rng = np.random.default_rng([seed, *table.shape[1:]])
        return (initializer_range * rng.standard_normal((len(pieces), *table.shape[1:]))).astype(table.dtype)
    raise ValueError(f"--init={init!r}; expected one of {INITS}")


def extended_size(table_rows: int, first_new_id: int, num_new: int) -> int:
    """Rows after extension: new ids take the rows from `first_new_id` (the old tokenizer's size) on, reusing a
    model's padding rows past its tokenizer (vocab_size rounded up, as ModernBERT's), growing the table if needed."""
    return max(table_rows, first_new_id + num_new)


def extend_state(state: dict[str, np.ndarray], names: Sequence[str], first_new_id: int,
                 pieces: Sequence[Sequence[int]], init: str = "fvt", seed: int = 0,
                 initializer_range: float = 0.02, where: str = "") -> dict[str, np.ndarray]:
    """`state` with the rows of the new ids first_new_id, first_new_id + 1, ... set in each tensor of `names` it
    holds, one per entry of `pieces` (the new word's old token ids, in new-id order); rows below first_new_id
    are copied untouched. The first name (the word embeddings) must be there; a head a folder lacks (a
    BertModel-only checkpoint) is skipped. `where` names the folder in errors."""
    if names[0] not in state:
        raise ValueError(f"{where or 'the folder'} holds no {names[0]}: no word embeddings to extend")
    out = dict(state)
    for name in names:
        if name not in state:
            continue
        table = np.asarray(state[name])
        if table.shape[0] < first_new_id:
            raise ValueError(f"{where}: {name} has {table.shape[0]} rows, fewer than the tokenizer's "
                             f"{first_new_id} tokens")
        rows = extended_size(table.shape[0], first_new_id, len(pieces))
        grown = np.concatenate([table, np.zeros((rows - table.shape[0], *table.shape[1:]), table.dtype)])
        grown[first_new_id:first_new_id + len(pieces)] = _new_rows(table[:first_new_id], pieces, init, seed,
                                                                   initializer_range)
        out[name] = grown
    return out
