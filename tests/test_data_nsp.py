"""Sentence pairs: layout, true-next continuity, label balance, skipped documents."""

import numpy as np
import pytest

from data_pipelines import nsp
from data_pipelines.tokenizer import SpecialIds

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
MAX_SEQ_LENGTH = 64


def _documents(num_docs: int, seed: int):
    """Documents whose token ids count up through the corpus, plus id -> document.

    A run of tokens read in order from one document is then a run of consecutive ids.
    Segments hold 3..12 tokens, so a pair overshoots its budget (and is cut) by fewer
    than 12 tokens.
    """
    rng = np.random.default_rng(seed)
    documents, where = [], {}
    next_id = 5
    for d in range(num_docs):
        document = []
        for _ in range(int(rng.integers(2, 30))):
            length = int(rng.integers(3, 13))
            segment = np.arange(next_id, next_id + length, dtype=np.int32)
            where.update({int(t): d for t in segment})
            next_id += length
            document.append(segment)
        documents.append(document)
    return documents, where


def _build(documents, seed=0, **overrides):
    kwargs = dict(
        special_ids=SPECIALS,
        max_seq_length=MAX_SEQ_LENGTH,
        short_seq_prob=0.1,
        nsp_random_prob=0.5,
        seed=seed,
    )
    kwargs.update(overrides)
    return nsp.build_nsp_examples(documents, **kwargs)


def _split(row, types):
    """[CLS] A [SEP] B [SEP] -> (A, B), checking the layout and the segment ids."""
    real = row[row != SPECIALS.pad]
    assert real[0] == SPECIALS.cls and real[-1] == SPECIALS.sep
    seps = np.flatnonzero(real == SPECIALS.sep)
    assert len(seps) == 2 and np.all(row[len(real):] == SPECIALS.pad)
    a, b = real[1 : seps[0]], real[seps[0] + 1 : -1]
    expected_types = np.zeros(len(row), np.int8)
    expected_types[seps[0] + 1 : len(real)] = 1
    assert np.array_equal(types, expected_types)
    return a, b


def test_true_next_b_continues_a_and_random_b_comes_from_another_document():
    documents, where = _documents(300, seed=0)
    examples, stats = _build(documents)
    assert stats.examples == len(examples["input_ids"]) > 800
    gaps = []
    for row, types, label in zip(
        examples["input_ids"], examples["token_type_ids"], examples["next_sentence_label"]
    ):
        a, b = _split(row, types)
        assert len(a) and len(b) and len(a) + len(b) <= MAX_SEQ_LENGTH - 3
        assert np.all(np.diff(a) == 1) and np.all(np.diff(b) == 1)  # Runs read in order.
        a_doc, b_doc = where[int(a[0])], where[int(b[0])]
        assert where[int(a[-1])] == a_doc and where[int(b[-1])] == b_doc
        if label == nsp.IS_NEXT:
            # B starts where A ends, but for the < 12 tokens truncation may cut between.
            assert b_doc == a_doc and 0 <= b[0] - a[-1] - 1 < 12
            gaps.append(int(b[0] - a[-1] - 1))
        else:
            assert b_doc != a_doc
    assert gaps.count(0) > 0.5 * len(gaps)  # Usually nothing is cut between A and B.


def test_labels_are_balanced():
    documents, _ = _documents(800, seed=1)
    examples, _ = _build(documents)
    labels = examples["next_sentence_label"]
    assert len(labels) > 2000
    assert labels.mean() == pytest.approx(0.5, abs=0.03)


def test_empty_and_single_segment_documents_are_skipped_and_counted():
    documents, _ = _documents(20, seed=2)
    empty = np.zeros(0, np.int32)
    single = [np.arange(10**6, 10**6 + 15, dtype=np.int32)]
    examples, stats = _build([[], [empty, empty], single, *documents])
    assert stats.documents == 23
    assert stats.empty_documents == 2
    assert stats.single_segment_documents == 1
    assert not np.isin(single[0], examples["input_ids"]).any()


def test_a_lone_document_yields_only_true_next_pairs():
    documents, _ = _documents(1, seed=3)
    examples, _ = _build(documents)
    assert len(examples["next_sentence_label"]) > 0
    assert not examples["next_sentence_label"].any()


def test_same_seed_same_examples_other_seed_differs():
    documents, _ = _documents(50, seed=4)
    a, _ = _build(documents, seed=5)
    b, _ = _build(documents, seed=5)
    c, _ = _build(documents, seed=6)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["next_sentence_label"], c["next_sentence_label"])


def test_long_pairs_are_truncated_to_fit():
    long_segments = [[np.arange(5 + 100 * i + 1000 * d, 105 + 100 * i + 1000 * d) for i in range(4)]
                     for d in range(3)]
    examples, stats = _build(long_segments, short_seq_prob=0.0)
    assert stats.truncated_tokens > 0
    lengths = (examples["input_ids"] != SPECIALS.pad).sum(axis=1)
    assert lengths.max() == MAX_SEQ_LENGTH
