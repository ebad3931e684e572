"""The bigram-shift set of bench/make_finetune_data.py: labels that mean what they say, splits that repeat."""
import csv
import os
import random
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench import make_finetune_data  # noqa: E402

SENTENCE = "The returned value is bound to the function name instead of the function object."


@pytest.mark.parametrize("seed", range(20))
def test_a_shift_swaps_two_adjacent_different_words_and_nothing_else(seed):
    shifted = make_finetune_data.shift_bigram(SENTENCE, random.Random(seed))
    before, after = SENTENCE.split(), shifted.split()
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(before) == len(after) and len(changed) == 2 and changed[1] == changed[0] + 1
    i = changed[0]
    bare = lambda w: w.lower().rstrip(".")  # noqa: E731
    assert (bare(after[i]), bare(after[i + 1])) == (bare(before[i + 1]), bare(before[i]))
    assert shifted[0].isupper() and shifted.endswith(".")


def test_a_shuffle_keeps_the_words_in_another_order():
    shuffled = make_finetune_data.shuffle_words(SENTENCE, random.Random(0))
    assert shuffled != SENTENCE and sorted(shuffled.split()) == sorted(SENTENCE.split())


@pytest.mark.slow
def test_splits_are_balanced_disjoint_and_repeat_by_seed(tmp_path):
    sizes = dict(train=200, validation=50, test=50)
    files = make_finetune_data.make(str(tmp_path / "a"), seed=3, **sizes)
    again = make_finetune_data.make(str(tmp_path / "b"), seed=3, **sizes)
    other = make_finetune_data.make(str(tmp_path / "c"), seed=4, **sizes)
    rows = {}
    for name, path in files.items():
        with open(path, newline="") as f:
            rows[name] = list(csv.DictReader(f))
        assert len(rows[name]) == sizes[name]
        assert sum(r["label"] == "shifted" for r in rows[name]) == sizes[name] // 2
        assert open(path).read() == open(again[name]).read() != open(other[name]).read()
    sentences = [{r["sentence"] for r in split} for split in rows.values()]
    assert not (sentences[0] & sentences[1] or sentences[0] & sentences[2] or sentences[1] & sentences[2])
