"""Masked-LM corruption of a whole batch at once, in numpy, driven by an explicit Generator.

Masking runs each time a batch is read (dynamic masking, Liu et al. 2019 §4.1), as a
pure function of (input_ids, rng): the pipeline derives `rng` from the seed and the
batch's position in the stream, so a resumed run masks identically.

All four modes are one algorithm over "units" (runs of tokens masked together):

  token       a unit is one token (BERT, Devlin et al. 2019 §3.1)
  whole_word  a unit is one word: a token flagged as a word start plus the tokens
              after it that are not (BERT's whole-word-masking release)
  span        a unit is a run of whole words whose length is drawn from a geometric
              distribution with p = span_p, truncated at max_span_length and
              renormalised (SpanBERT, Joshi et al. 2020 §3.1: mean 3.8 words at p = 0.2)
  ngram       a unit is a run of n whole words, p(n) ∝ 1/n for n in 1..max_ngram
              (ALBERT, Lan et al. 2020 §4.1)

Each row's words are cut into consecutive units of the drawn lengths (special tokens
always end a unit, so a unit never holds [CLS]/[SEP]/[PAD]); the units are then taken in
random order while the masked-token count stays within the row's budget
max(1, round(mask_rate x non-special tokens)), capped at max_predictions_per_seq. That cap is
`auto` by default: ceil(mask_rate x max_seq_length), which no row's budget reaches, so the
rate asked for is the rate trained at (`max_predictions`; a set cap that would bind is refused
by bert_jax/train/config_validation.py). Each batch carries `maskable_tokens`, the non-special
tokens per row, so a run can log the realised rate (`train/masked_fraction`). Cutting
instead of placing spans at random starts keeps units disjoint without a loop, so every
step is a vectorised numpy operation over the batch.

With `span_boundaries` (config.data.span_boundaries) each prediction also gets its span's boundary
positions and its offset within the span, for SpanBERT's span boundary objective (span_boundaries.py).

Of the selected tokens 80% become [MASK], 10% a random ordinary token, 10% stay
(Devlin et al. 2019, Appendix C.2; `mask_token_share`, `random_token_share`). Span mode decides
once per span, as SpanBERT does; the other modes decide per token. A random token is one the
tokenizer can emit: an id below the tokenizer's size (not config.model.vocab_size, whose extra
rows no text holds) and, by default, not a special (`random_tokens`).

Where transformers' DataCollatorForLanguageModeling differs, a key chooses (docs/guides/parity.md):
`mask_count=bernoulli` selects each maskable token (or unit) independently with probability
mask_rate, as the collator does, instead of an exact budget per row; `random_tokens=any` draws
replacements from every id of the tokenizer, specials included, as the collator's
randint(len(tokenizer)) does. A bernoulli row may select any number of tokens, so its gather is
max_seq_length wide (`auto`), and a narrower one is refused rather than dropping selections.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import numpy as np

from bert_jax.objective_names import is_causal
from bert_jax.registry import Registry
from data_pipelines.loader.span_boundaries import SPAN_BOUNDARY_KEYS, span_boundaries
from data_pipelines.tokenizers.tokenizer import SpecialIds

MASK_TOKEN_SHARE = 0.8
RANDOM_TOKEN_SHARE = 0.1
# config.data.mask_count: how many tokens a row's selection holds.
MASK_COUNTS = ("exact", "bernoulli")
# config.data.random_tokens: which ids a random replacement is drawn from.
RANDOM_TOKENS = ("ordinary", "any")
# config.data.max_predictions_per_seq's default: derived from mask_rate and max_seq_length.
AUTO = "auto"


def expected_predictions(mask_rate: float, max_seq_length: int) -> int:
    """ceil(mask_rate x max_seq_length): more than any row's budget round(mask_rate x non-special tokens).

    Rounded to 6 places first, so that 0.15 x 20 (3.0000000000000004 in floats) is 3, not 4.
    """
    return max(1, math.ceil(round(mask_rate * max_seq_length, 6)))


def needed_predictions(data_cfg) -> int:
    """The narrowest gather that never drops a selection: expected_predictions for an exact budget, the whole
    row for bernoulli selection (any number of a row's tokens may be drawn)."""
    if data_cfg.get("mask_count", "exact") == "bernoulli":
        return data_cfg.max_seq_length
    return expected_predictions(data_cfg.mask_rate, data_cfg.max_seq_length)


def max_predictions(data_cfg) -> int:
    """config.data.max_predictions_per_seq as a number: `auto` resolves to needed_predictions."""
    value = data_cfg.max_predictions_per_seq
    if value == AUTO:
        return needed_predictions(data_cfg)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"config.data.max_predictions_per_seq={value!r}: expected 'auto' or a number") from None


def predicted_positions(data_cfg) -> int:
    """Positions per row the LM head decodes: the masked-position gather's width (max_predictions), or every
    position of the row under a causal objective (config.data.objective), whose head runs at all of them."""
    return data_cfg.max_seq_length if is_causal(data_cfg) else max_predictions(data_cfg)


def span_length_distribution(span_p: float, max_span_length: int) -> tuple[np.ndarray, np.ndarray]:
    """SpanBERT's span lengths 1..max_span_length and their probabilities (truncated geometric)."""
    lengths = np.arange(1, max_span_length + 1)
    weights = span_p * (1 - span_p) ** (lengths - 1)
    return lengths, weights / weights.sum()


def ngram_length_distribution(max_ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """ALBERT's n-gram lengths 1..max_ngram and their probabilities, p(n) ∝ 1/n."""
    lengths = np.arange(1, max_ngram + 1)
    weights = 1.0 / lengths
    return lengths, weights / weights.sum()


def random_non_special_ids(
    rng: np.random.Generator, size: int, vocab_size: int, special: Iterable[int]
) -> np.ndarray:
    """Draws `size` ids uniformly from [0, vocab_size) minus the special ids."""
    pool = np.setdiff1d(np.arange(vocab_size), np.asarray(sorted(set(special))))
    return pool[rng.integers(0, len(pool), size=size)]


@dataclasses.dataclass(frozen=True)
class MaskingMode:
    """What a value of config.data.masking makes a unit (the module docstring): tokens or words, words cut into
    runs of drawn lengths, and whether the 80/10/10 choice is made per token or per unit."""

    by_word: bool  # units are whole words: needs the tokenizer's word_start_flags()
    # spec -> (lengths, probabilities) of a unit's run of words; None: a unit is one word (or token).
    run_lengths: Callable[[MaskingSpec], tuple[np.ndarray, np.ndarray]] | None = None
    decide_per_unit: bool = False  # one 80/10/10 draw per unit (SpanBERT) rather than per token
    # spec -> None, or ValueError naming the config.data key of the mode's own settings that is out of range.
    validate: Callable[[MaskingSpec], None] = lambda spec: None


def _check_span(spec: MaskingSpec) -> None:
    if not (0.0 < spec.span_p <= 1.0 and spec.max_span_length >= 1):
        raise ValueError(
            f"config.data.span_p={spec.span_p} must be in (0, 1] and "
            f"config.data.max_span_length={spec.max_span_length} >= 1"
        )


def _check_ngram(spec: MaskingSpec) -> None:
    if spec.max_ngram < 1:
        raise ValueError(f"config.data.max_ngram={spec.max_ngram} must be >= 1")


MASKING_MODES: Registry[MaskingMode] = Registry("config.data.masking", "masking modes")
MASKING_MODES.register("token", MaskingMode(by_word=False))
MASKING_MODES.register("whole_word", MaskingMode(by_word=True))
MASKING_MODES.register("span", MaskingMode(
    by_word=True, run_lengths=lambda spec: span_length_distribution(spec.span_p, spec.max_span_length),
    decide_per_unit=True, validate=_check_span))
MASKING_MODES.register("ngram", MaskingMode(
    by_word=True, run_lengths=lambda spec: ngram_length_distribution(spec.max_ngram), validate=_check_ngram))


@dataclasses.dataclass(frozen=True)
class MaskingSpec:
    """What to mask; built from `config.data` by `from_config`."""

    mode: str
    mask_rate: float
    max_predictions_per_seq: int
    vocab_size: int
    span_p: float = 0.2
    max_span_length: int = 10
    max_ngram: int = 3
    mask_token_share: float = MASK_TOKEN_SHARE  # of the selected tokens, the share that becomes [MASK]
    random_token_share: float = RANDOM_TOKEN_SHARE  # ... a random token; the rest stay as they are
    random_tokens: str = "ordinary"  # RANDOM_TOKENS
    mask_count: str = "exact"  # MASK_COUNTS
    max_seq_length: int = 0  # the rows' length, where known: a bernoulli gather narrower than it is refused
    # Add each prediction's span boundaries and offset (span_boundaries.py; SpanBERT's SBO reads them).
    span_boundaries: bool = False

    @classmethod
    def from_config(cls, data_cfg) -> "MaskingSpec":
        return cls(
            mode=data_cfg.masking,
            mask_rate=data_cfg.mask_rate,
            max_predictions_per_seq=max_predictions(data_cfg),
            vocab_size=data_cfg.vocab_size,
            span_p=data_cfg.span_p,
            max_span_length=data_cfg.max_span_length,
            max_ngram=data_cfg.max_ngram,
            mask_token_share=data_cfg.get("mask_token_share", MASK_TOKEN_SHARE),
            random_token_share=data_cfg.get("random_token_share", RANDOM_TOKEN_SHARE),
            random_tokens=data_cfg.get("random_tokens", "ordinary"),
            mask_count=data_cfg.get("mask_count", "exact"),
            max_seq_length=data_cfg.max_seq_length,
            span_boundaries=bool(data_cfg.get("span_boundaries", False)),
        )

    def _bernoulli_cap_error(self, length: int) -> str:
        return (f"config.data.mask_count='bernoulli' may select all {length} tokens of a row, but "
                f"config.data.max_predictions_per_seq={self.max_predictions_per_seq}: set it to auto "
                f"(= max_seq_length) rather than drop selections")

    @property
    def kind(self) -> MaskingMode:
        """The registered mode `mode` names; `bert_jax.UserError` naming config.data.masking otherwise."""
        return MASKING_MODES.get(self.mode)

    def validate(self) -> None:
        """ValueError naming the config.data key that is out of range."""
        kind = self.kind
        if not 0.0 < self.mask_rate < 1.0:
            raise ValueError(f"config.data.mask_rate={self.mask_rate} must be in (0, 1)")
        if self.max_predictions_per_seq < 1:
            raise ValueError(
                f"config.data.max_predictions_per_seq={self.max_predictions_per_seq} must be >= 1"
            )
        shares = (self.mask_token_share, self.random_token_share)
        if min(shares) < 0 or sum(shares) > 1:
            raise ValueError(
                f"config.data.mask_token_share={self.mask_token_share} and config.data.random_token_share="
                f"{self.random_token_share} must be >= 0 and sum to at most 1 (the rest stay unchanged)"
            )
        if self.random_tokens not in RANDOM_TOKENS:
            raise ValueError(f"config.data.random_tokens={self.random_tokens!r}: expected one of {RANDOM_TOKENS}")
        if self.mask_count not in MASK_COUNTS:
            raise ValueError(f"config.data.mask_count={self.mask_count!r}: expected one of {MASK_COUNTS}")
        if self.mask_count == "bernoulli" and 0 < self.max_predictions_per_seq < self.max_seq_length:
            raise ValueError(self._bernoulli_cap_error(self.max_seq_length))
        kind.validate(self)


class Masker:
    """Masks batches per a MaskingSpec; holds only lookup tables built once.

    Args:
      spec: the mode and its rates.
      special_ids: never selected; never drawn as random replacements unless spec.random_tokens is "any".
      word_starts: [vocab] bool, True where a token begins a word (the tokenizer's
        `word_start_flags()`); needed by every mode whose units are words (`MaskingMode.by_word`).
      tokenizer_size: the tokenizer's vocabulary size (`get_vocab_size()`), when smaller than
        spec.vocab_size: random replacements stay below it, among ids the text can hold.
    """

    def __init__(self, spec: MaskingSpec, special_ids: SpecialIds, word_starts=None,
                 tokenizer_size: int | None = None):
        spec.validate()
        self.spec = spec
        self.special_ids = special_ids
        table_size = max(spec.vocab_size, max(special_ids.all()) + 1)
        if word_starts is not None:
            table_size = max(table_size, len(word_starts))
        self._is_special = np.zeros(table_size, bool)
        self._is_special[list(special_ids.all())] = True
        if not spec.kind.by_word:
            self._starts_word = None
        else:
            if word_starts is None:
                raise ValueError(
                    f"config.data.masking={spec.mode!r} needs the tokenizer's word_start_flags()"
                )
            self._starts_word = np.ones(table_size, bool)
            self._starts_word[: len(word_starts)] = np.asarray(word_starts, bool)
        pool_size = min(spec.vocab_size, tokenizer_size or spec.vocab_size)
        if spec.random_tokens == "any":
            self._replacements = np.arange(pool_size)
        else:
            self._replacements = np.flatnonzero(~self._is_special[:pool_size])
        self._lengths = spec.kind.run_lengths(spec) if spec.kind.run_lengths else None

    def _units(self, ids: np.ndarray, special: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """[B, L] int: index within its row of the unit each token belongs to."""
        batch, length = ids.shape
        if self._starts_word is None:
            return np.broadcast_to(np.arange(length), (batch, length))
        starts = self._starts_word[ids]
        starts[:, 1:] |= special[:, :-1]  # A token right after a special starts a word.
        starts[:, 0] = True
        word = np.cumsum(starts, axis=1) - 1
        if self._lengths is None:
            return word
        # Cut the words into runs of drawn lengths: a boundary at each run's first word,
        # and around every special token's word, so no run holds a special token.
        values, probs = self._lengths
        draw = np.searchsorted(np.cumsum(probs), rng.random((batch, length)), side="right")
        drawn = values[np.minimum(draw, len(values) - 1)]
        run_starts = np.cumsum(drawn, axis=1) - drawn
        boundary = np.zeros((batch, length + 1), bool)
        rows = np.broadcast_to(np.arange(batch)[:, None], run_starts.shape)
        inside = run_starts < length
        boundary[rows[inside], run_starts[inside]] = True
        special_word = np.zeros((batch, length + 1), bool)
        special_word[np.nonzero(special)[0], word[special]] = True
        boundary |= special_word
        boundary[:, 1:] |= special_word[:, :-1]
        run_of_word = np.cumsum(boundary[:, :length], axis=1) - 1
        return np.take_along_axis(run_of_word, word, axis=1)

    def _select_tokens(self, candidate, budget, rng) -> np.ndarray:
        """[B, L] bool: a uniform subset of `budget` candidates per row (token mode).

        The budget-th smallest of i.i.d. uniform keys is the row's threshold: one sort of
        the keys instead of an argsort and gathers, which is what makes this mode fast.
        """
        batch = len(candidate)
        keys = rng.random(candidate.shape)
        keys[~candidate] = 2.0
        threshold = np.sort(keys, axis=1)[np.arange(batch), np.maximum(budget - 1, 0)]
        selected = (keys <= threshold[:, None]) & candidate & (budget > 0)[:, None]
        # float64 keys tie with probability ~1e-11; never let a tie exceed the budget.
        return selected & (np.cumsum(selected, axis=1) <= budget[:, None])

    def _select_bernoulli(self, unit, candidate, rng) -> np.ndarray:
        """[B, L] bool: each candidate token (or each unit, whole) independently with probability mask_rate."""
        draws = rng.random(candidate.shape) < self.spec.mask_rate  # one draw per token, or per unit index
        if unit is None:
            return draws & candidate
        return np.take_along_axis(draws, unit, axis=1) & candidate

    def _select_units(self, unit, candidate, budget, rng) -> np.ndarray:
        """[B, L] bool: whole units in random order while their tokens fit the budget."""
        batch, length = unit.shape
        flat_unit = (np.arange(batch)[:, None] * length + unit)[candidate]
        unit_tokens = np.bincount(flat_unit, minlength=batch * length).reshape(batch, length)
        # A unit longer than max_predictions_per_seq (a 30-piece word) can never be whole.
        unit_tokens[unit_tokens > self.spec.max_predictions_per_seq] = 0
        # Random order of the units: sort random high bits packed above each unit's index
        # (a plain sort is several times faster than argsort); empty units go last.
        index_bits = max(1, int(length - 1).bit_length())
        keys = rng.integers(0, 1 << (62 - index_bits), size=(batch, length), dtype=np.int64)
        keys[unit_tokens == 0] = (1 << (62 - index_bits)) - 1
        order = np.sort((keys << index_bits) | np.arange(length), axis=1) & ((1 << index_bits) - 1)
        ordered_tokens = np.take_along_axis(unit_tokens, order, axis=1)
        # Whole units while they fit; the first unit that overflows is taken with
        # probability (budget left) / (its tokens), so a row's expected count is its
        # budget whatever the unit lengths (a plain prefix would undershoot with spans).
        after = np.cumsum(ordered_tokens, axis=1)
        before = after - ordered_tokens
        fits = after <= budget[:, None]
        overflow = (before < budget[:, None]) & ~fits
        draw = rng.random((batch, 1))
        rows, cols = np.nonzero(overflow)  # At most one unit per row: its odds alone are computed.
        odds = (budget[rows] - before[rows, cols]) / np.maximum(ordered_tokens[rows, cols], 1)
        overflow[rows, cols] = draw[rows, 0] < odds
        chosen_in_order = (fits | overflow) & (ordered_tokens > 0)
        chosen_in_order &= after <= self.spec.max_predictions_per_seq
        chosen_unit = np.zeros((batch, length), bool)
        np.put_along_axis(chosen_unit, order, chosen_in_order, axis=1)
        return np.take_along_axis(chosen_unit, unit, axis=1) & candidate

    def __call__(self, input_ids: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Selects positions to predict and corrupts them.

        Args:
          input_ids: [B, L] int token ids, padded (padding is a special id).
          rng: the only source of randomness.

        Returns:
          input_ids: [B, L] int32, the corrupted batch.
          masked_positions: [B, P] int32, selected positions in increasing order, then 0s.
          masked_ids: [B, P] int32, the original ids there, then 0s.
          masked_weights: [B, P] float32, 1.0 for a real prediction, 0.0 for padding.
          maskable_tokens: [B] int32, the row's non-special tokens (what mask_rate is a share of).
          with spec.span_boundaries, masked_span_left, masked_span_right, masked_span_offset: [B, P] int32,
            each prediction's span boundary positions and its offset in the span (span_boundaries.py), then 0s.
          P = max_predictions_per_seq.
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 2:
            raise ValueError(f"input_ids must be [batch, length], got shape {ids.shape}")
        spec = self.spec
        batch, length = ids.shape
        special = self._is_special[ids]
        candidate = ~special
        num_candidates = candidate.sum(axis=1)
        budget = np.where(
            num_candidates > 0,
            np.clip(np.rint(num_candidates * spec.mask_rate), 1, spec.max_predictions_per_seq),
            0,
        ).astype(np.int64)
        unit = None if self._starts_word is None else self._units(ids, special, rng)
        if spec.mask_count == "bernoulli":
            if spec.max_predictions_per_seq < length:
                raise ValueError(spec._bernoulli_cap_error(length))
            selected = self._select_bernoulli(unit, candidate, rng)
        elif unit is None:
            selected = self._select_tokens(candidate, budget, rng)
        else:
            selected = self._select_units(unit, candidate, budget, rng)

        rows, cols = np.nonzero(selected)  # Row-major: positions increase within a row.
        per_row = selected.sum(axis=1)
        slots = np.arange(len(rows)) - (np.cumsum(per_row) - per_row)[rows]
        originals = ids[rows, cols]

        if spec.kind.decide_per_unit:
            decision = rng.random((batch, length))[rows, unit[rows, cols]]  # One draw per span.
        else:
            decision = rng.random(len(rows))
        replacement = originals.copy()
        mask_share, random_share = spec.mask_token_share, spec.random_token_share
        replacement[decision < mask_share] = self.special_ids.mask
        use_random = (decision >= mask_share) & (decision < mask_share + random_share)
        replacement[use_random] = self._replacements[
            rng.integers(0, len(self._replacements), size=int(use_random.sum()))
        ]

        masked = ids.astype(np.int32, copy=True)
        masked[rows, cols] = replacement
        predictions = spec.max_predictions_per_seq
        masked_positions = np.zeros((batch, predictions), np.int32)
        masked_ids = np.zeros((batch, predictions), np.int32)
        masked_weights = np.zeros((batch, predictions), np.float32)
        masked_positions[rows, slots] = cols
        masked_ids[rows, slots] = originals
        masked_weights[rows, slots] = 1.0
        features = {
            "input_ids": masked,
            "masked_positions": masked_positions,
            "masked_ids": masked_ids,
            "masked_weights": masked_weights,
            "maskable_tokens": num_candidates.astype(np.int32),
        }
        if spec.span_boundaries:  # computed from the selection alone: no draw, so the masks above are unchanged
            for key, per_token in zip(SPAN_BOUNDARY_KEYS, span_boundaries(selected), strict=True):
                features[key] = np.zeros((batch, predictions), np.int32)
                features[key][rows, slots] = per_token[rows, cols]
        return features
