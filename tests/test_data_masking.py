"""Masked-LM corruption: rates, the 80/10/10 split, whole words, span lengths, determinism."""

import numpy as np
import pytest

from data_pipelines.loader import masking
from data_pipelines.tokenizers.tokenizer import SpecialIds

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 8192


def _batch(rows: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, length] '[CLS] a [SEP] b [SEP] [PAD]...' rows of ordinary ids."""
    ids = rng.integers(5, VOCAB, size=(rows, length)).astype(np.int32)
    for row in ids:
        real = int(rng.integers(length // 2, length + 1))
        sep = int(rng.integers(2, real - 1))
        row[0], row[sep], row[real - 1] = SPECIALS.cls, SPECIALS.sep, SPECIALS.sep
        row[real:] = SPECIALS.pad
    return ids


def _masker(mode="token", rate=0.15, predictions=128, word_starts=None, **kwargs):
    spec = masking.MaskingSpec(mode, rate, predictions, VOCAB, **kwargs)
    return masking.Masker(spec, SPECIALS, word_starts)


def _selected(out, shape) -> np.ndarray:
    """[B, L] bool: the positions the masker chose to predict."""
    selected = np.zeros(shape, bool)
    rows, slots = np.nonzero(out["masked_weights"])
    selected[rows, out["masked_positions"][rows, slots]] = True
    return selected


@pytest.mark.parametrize("rate", [0.15, 0.4])
def test_token_masking_rate_and_80_10_10_split(rate):
    rng = np.random.default_rng(0)
    ids = _batch(1200, 128, rng)
    out = _masker(rate=rate)(ids, rng)
    chosen = _selected(out, ids.shape)
    candidates = ids > SPECIALS.mask
    assert candidates.sum() >= 100_000
    assert chosen.sum() / candidates.sum() == pytest.approx(rate, abs=0.005)
    assert not (chosen & ~candidates).any()
    now, before = out["input_ids"][chosen], ids[chosen]
    assert np.mean(now == SPECIALS.mask) == pytest.approx(0.8, abs=0.015)
    assert np.mean(now == before) == pytest.approx(0.1, abs=0.01)
    replaced = now[(now != SPECIALS.mask) & (now != before)]
    assert len(replaced) / chosen.sum() == pytest.approx(0.1, abs=0.01)
    assert not np.isin(replaced, SPECIALS.all()).any()
    assert np.array_equal(out["input_ids"][~chosen], ids[~chosen])


def test_prediction_count_follows_bert_rule_and_pads_with_zero_weight():
    rng = np.random.default_rng(2)
    ids = np.array([[2, *range(10, 110), 3, 0, 0]], np.int32)  # 100 candidates.
    capped = _masker(predictions=5)(ids, rng)
    assert capped["masked_weights"].tolist() == [[1.0] * 5]
    out = _masker(predictions=20)(ids, rng)
    assert out["masked_weights"][0].tolist() == [1.0] * 15 + [0.0] * 5
    assert out["masked_positions"][0, 15:].tolist() == [0] * 5
    assert out["masked_ids"][0, 15:].tolist() == [0] * 5
    assert np.all(np.diff(out["masked_positions"][0, :15]) > 0)
    assert np.array_equal(out["masked_ids"][0, :15], ids[0, out["masked_positions"][0, :15]])
    short = np.array([[2, 9, 3, 0], [2, 3, 0, 0]], np.int32)
    both = _masker(predictions=3)(short, rng)
    assert both["masked_positions"].tolist() == [[1, 0, 0], [0, 0, 0]]  # max(1, round(0.15)) = 1.
    assert both["masked_weights"][1].sum() == 0
    assert both["input_ids"][1].tolist() == [2, 3, 0, 0]
    assert {k: (v.dtype, v.shape) for k, v in out.items()} == {
        "input_ids": (np.int32, (1, ids.shape[1])),
        "masked_positions": (np.int32, (1, 20)),
        "masked_ids": (np.int32, (1, 20)),
        "masked_weights": (np.float32, (1, 20)),
        "maskable_tokens": (np.int32, (1,)),
    }
    assert out["maskable_tokens"].tolist() == [100] and both["maskable_tokens"].tolist() == [1, 0]  # non-special


@pytest.mark.parametrize("mode", ["whole_word", "span", "ngram"])
def test_whole_words_are_masked_entirely_or_not_at_all(mode):
    rng = np.random.default_rng(3)
    word_starts = rng.random(VOCAB) < 0.6  # Words of ~1.7 tokens on average.
    ids = _batch(600, 128, rng)
    out = _masker(mode, word_starts=word_starts)(ids, rng)
    chosen = _selected(out, ids.shape)
    special = ids <= SPECIALS.mask
    starts = word_starts[ids] | special
    starts[:, 1:] |= special[:, :-1]
    word = np.cumsum(starts, axis=1)
    for row in range(len(ids)):
        for w in np.unique(word[row][chosen[row]]):
            members = (word[row] == w) & ~special[row]
            assert chosen[row][members].all(), f"row {row}: word {w} partly masked"
    candidates = ~special
    assert chosen.sum() / candidates.sum() == pytest.approx(0.15, abs=0.01)
    assert not (chosen & special).any()


@pytest.mark.parametrize(
    "mode, theory",
    [
        ("span", float(np.dot(*masking.span_length_distribution(0.2, 10)))),  # 3.80 (SpanBERT)
        ("ngram", 3 / (1 + 1 / 2 + 1 / 3)),  # 1.64: p(n) ∝ 1/n, n <= 3 (ALBERT)
    ],
)
def test_mean_span_length_matches_theory(mode, theory):
    """Every token a word; at a 5% rate adjacent spans rarely touch, so runs are spans."""
    rng = np.random.default_rng(4)
    ids = rng.integers(5, VOCAB, (300, 512)).astype(np.int32)
    ids[:, 0], ids[:, -1] = SPECIALS.cls, SPECIALS.sep
    out = _masker(mode, rate=0.05, predictions=512, word_starts=np.ones(VOCAB, bool))(ids, rng)
    edges = np.diff(np.pad(_selected(out, ids.shape).astype(np.int8), ((0, 0), (1, 1))), axis=1)
    run_lengths = np.nonzero(edges == -1)[1] - np.nonzero(edges == 1)[1]
    assert len(run_lengths) > 1000
    assert np.mean(run_lengths > (10 if mode == "span" else 3)) < 0.05  # Only touching spans.
    assert np.mean(run_lengths) == pytest.approx(theory, rel=0.05)


def test_span_mode_corrupts_whole_spans_alike():
    """SpanBERT replaces a span all with [MASK], all with random tokens, or keeps it."""
    rng = np.random.default_rng(5)
    ids = rng.integers(5, VOCAB, (200, 512)).astype(np.int32)
    ids[:, 0], ids[:, -1] = SPECIALS.cls, SPECIALS.sep
    out = _masker("span", rate=0.03, predictions=512, word_starts=np.ones(VOCAB, bool))(ids, rng)
    chosen = _selected(out, ids.shape)
    is_mask = out["input_ids"] == SPECIALS.mask
    mixed = 0
    for row in range(len(ids)):
        edges = np.diff(np.pad(chosen[row].astype(np.int8), 1))
        for start, end in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
            mixed += 0 < is_mask[row, start:end].sum() < end - start
    assert mixed <= 0.05 * chosen.sum() / 3.8  # Only where two spans touch.


def test_same_generator_state_gives_same_mask_and_other_seeds_differ():
    ids = _batch(8, 128, np.random.default_rng(6))
    masker = _masker("whole_word", word_starts=np.random.default_rng(0).random(VOCAB) < 0.5)
    a = masker(ids, np.random.default_rng([7, 1]))
    b = masker(ids, np.random.default_rng([7, 1]))
    c = masker(ids, np.random.default_rng([7, 2]))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["masked_positions"], c["masked_positions"])


def test_bad_settings_name_the_config_key():
    with pytest.raises(ValueError, match="config.data.masking='spans'"):
        _masker("spans")
    with pytest.raises(ValueError, match="config.data.mask_rate=1.5"):
        _masker(rate=1.5)
    with pytest.raises(ValueError, match="word_start_flags"):
        _masker("whole_word")


def test_random_replacements_are_uniform_over_ordinary_ids():
    draws = masking.random_non_special_ids(np.random.default_rng(4), 70_000, 10, (0, 3, 7))
    counts = np.bincount(draws, minlength=10)
    assert counts[[0, 3, 7]].tolist() == [0, 0, 0]
    ordinary = counts[[1, 2, 4, 5, 6, 8, 9]]
    assert ordinary.min() > 0.95 * 10_000 and ordinary.max() < 1.05 * 10_000
