"""Masked-LM corruption: rates, the 80/10/10 split, specials, padding, determinism."""

import numpy as np
import pytest

from data_pipelines import masking
from data_pipelines.tokenizer import SpecialIds

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 8192


def _sequences(num: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """[num, length] '[CLS] a [SEP] b [SEP] [PAD]...' rows of ordinary ids."""
    rows = rng.integers(5, VOCAB, size=(num, length)).astype(np.int32)
    for row in rows:
        real = int(rng.integers(length // 2, length + 1))
        sep = int(rng.integers(2, real - 1))
        row[0], row[sep], row[real - 1] = SPECIALS.cls, SPECIALS.sep, SPECIALS.sep
        row[real:] = SPECIALS.pad
    return rows


def _mask(ids, rng, max_predictions):
    return masking.mask_example(
        ids, rng, special_ids=SPECIALS, vocab_size=VOCAB, max_predictions_per_seq=max_predictions
    )


def test_selection_rate_and_80_10_10_split_over_100k_tokens():
    rng = np.random.default_rng(0)
    rows = _sequences(1500, 128, rng)
    candidates = selected = as_mask = as_random = kept = 0
    for row in rows:
        out = _mask(row, rng, max_predictions=128)  # Uncapped: measures the rate itself.
        n = int(out["masked_weights"].sum())
        positions = out["masked_positions"][:n]
        now = out["input_ids"][positions]
        candidates += int(np.sum(row > SPECIALS.mask))
        selected += n
        as_mask += int(np.sum(now == SPECIALS.mask))
        kept += int(np.sum(now == row[positions]))
        as_random += int(np.sum((now != SPECIALS.mask) & (now != row[positions])))
    assert candidates >= 100_000
    assert selected / candidates == pytest.approx(0.15, abs=0.01)
    assert as_mask / selected == pytest.approx(0.8, abs=0.02)
    assert as_random / selected == pytest.approx(0.1, abs=0.02)
    assert kept / selected == pytest.approx(0.1, abs=0.02)


def test_specials_are_never_selected_nor_drawn_and_the_rest_is_untouched():
    rng = np.random.default_rng(1)
    for row in _sequences(300, 64, rng):
        out = _mask(row, rng, max_predictions=64)
        n = int(out["masked_weights"].sum())
        positions = out["masked_positions"][:n]
        assert not np.isin(row[positions], SPECIALS.all()).any()
        assert np.array_equal(out["masked_ids"][:n], row[positions])
        untouched = np.ones(len(row), bool)
        untouched[positions] = False
        assert np.array_equal(out["input_ids"][untouched], row[untouched])
        replaced = out["input_ids"][positions]
        assert not np.isin(replaced[replaced != SPECIALS.mask], SPECIALS.all()).any()


def test_prediction_count_follows_bert_rule_and_pads_with_zero_weight():
    rng = np.random.default_rng(2)
    ids = np.array([2, *range(10, 110), 3, 0, 0], np.int32)  # 100 candidates.
    capped = _mask(ids, rng, max_predictions=5)
    assert capped["masked_weights"].tolist() == [1.0] * 5
    out = _mask(ids, rng, max_predictions=20)
    assert out["masked_weights"].tolist() == [1.0] * 15 + [0.0] * 5
    assert out["masked_positions"][15:].tolist() == [0] * 5
    assert out["masked_ids"][15:].tolist() == [0] * 5
    assert np.all(np.diff(out["masked_positions"][:15]) > 0)
    one = _mask(np.array([2, 9, 3, 0], np.int32), rng, max_predictions=3)
    assert one["masked_positions"].tolist() == [1, 0, 0]  # max(1, round(0.15)) = 1.
    none = _mask(np.array([2, 3, 0, 0], np.int32), rng, max_predictions=3)
    assert none["masked_weights"].sum() == 0
    assert none["input_ids"].tolist() == [2, 3, 0, 0]
    assert {k: (v.dtype, v.shape) for k, v in out.items()} == {
        "input_ids": (np.int32, (len(ids),)),
        "masked_positions": (np.int32, (20,)),
        "masked_ids": (np.int32, (20,)),
        "masked_weights": (np.float32, (20,)),
    }


def test_same_generator_state_gives_same_mask_and_other_seeds_differ():
    ids = _sequences(1, 128, np.random.default_rng(3))[0]
    a = _mask(ids, np.random.default_rng([7, 1]), 20)
    b = _mask(ids, np.random.default_rng([7, 1]), 20)
    c = _mask(ids, np.random.default_rng([7, 2]), 20)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["masked_positions"], c["masked_positions"])


def test_random_replacements_are_uniform_over_ordinary_ids():
    draws = masking.random_non_special_ids(np.random.default_rng(4), 70_000, 10, (0, 3, 7))
    counts = np.bincount(draws, minlength=10)
    assert counts[[0, 3, 7]].tolist() == [0, 0, 0]
    ordinary = counts[[1, 2, 4, 5, 6, 8, 9]]
    assert ordinary.min() > 0.95 * 10_000 and ordinary.max() < 1.05 * 10_000
