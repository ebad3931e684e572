"""Example builders: NSP and SOP pairs, FULL-/DOC-SENTENCES rows, document-aware packing."""

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax.models.attention import attention_mask_from_batch
from bert_jax.kernels.attention import allowed_keys
from data_pipelines.examples import builders
from data_pipelines.tokenizers.tokenizer import SpecialIds

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


def _config(kind, **overrides):
    cfg = dict(example_builder=kind, max_seq_length=MAX_SEQ_LENGTH, short_seq_prob=0.1,
               nsp_random_prob=0.5, nsp_reservoir_docs=20)
    cfg.update(overrides)
    return ml_collections.ConfigDict(cfg)


def _build(kind, documents, seed=0, **overrides):
    builder = builders.make_builder(_config(kind, **overrides), SPECIALS)
    examples = []
    for position, document in enumerate(documents):
        examples += builder.add_document(document, np.random.default_rng([seed, position]), position)
    examples += builder.finish()
    return _rows(builder, examples), builder.stats


def _rows(builder, examples):
    """The builder's examples as rows (one dict each), through its batch `stack`."""
    if not examples:
        return []
    stacked = builder.stack(examples)
    return [{key: value[i] for key, value in stacked.items()} for i in range(len(examples))]


def _split(example):
    """[CLS] A [SEP] B [SEP] -> (A, B), checking the layout and the token types."""
    row, types = example["input_ids"], example["token_type_ids"]
    real = row[row != SPECIALS.pad]
    assert real[0] == SPECIALS.cls and real[-1] == SPECIALS.sep
    seps = np.flatnonzero(real == SPECIALS.sep)
    assert len(seps) == 2 and np.all(row[len(real):] == SPECIALS.pad)
    expected_types = np.zeros(len(row), np.int32)
    expected_types[seps[0] + 1 : len(real)] = 1
    assert np.array_equal(types, expected_types)
    return real[1 : seps[0]], real[seps[0] + 1 : -1]


def test_nsp_true_next_b_continues_a_and_random_b_comes_from_another_document():
    documents, where = _documents(300, seed=0)
    examples, stats = _build("nsp", documents)
    assert stats.examples == len(examples) > 800
    gaps, labels = [], []
    for example in examples:
        a, b = _split(example)
        label = int(example["next_sentence_label"])
        labels.append(label)
        assert len(a) and len(b) and len(a) + len(b) <= MAX_SEQ_LENGTH - 3
        assert np.all(np.diff(a) == 1) and np.all(np.diff(b) == 1)  # Runs read in order.
        a_doc, b_doc = where[int(a[0])], where[int(b[0])]
        assert where[int(a[-1])] == a_doc and where[int(b[-1])] == b_doc
        if label == builders.IS_NEXT:
            # B starts where A ends, but for the < 12 tokens truncation may cut between.
            assert b_doc == a_doc and 0 <= b[0] - a[-1] - 1 < 12
            gaps.append(int(b[0] - a[-1] - 1))
        else:
            assert b_doc != a_doc and a_doc - 20 <= b_doc < a_doc  # From the ring of 20.
    assert gaps.count(0) > 0.5 * len(gaps)  # Usually nothing is cut between A and B.
    assert np.mean(labels) == pytest.approx(0.5, abs=0.04)
    assert stats.random_next_without_reservoir <= 6  # Only the first document has no ring.


def test_sop_pairs_are_consecutive_and_swapped_exactly_when_labelled():
    documents, where = _documents(400, seed=1)
    examples, _ = _build("sop", documents)
    labels = []
    for example in examples:
        a, b = _split(example)
        label = int(example["sentence_order_label"])
        labels.append(label)
        assert where[int(a[0])] == where[int(b[0])]  # One document, always.
        first, second = (a, b) if label == builders.IN_ORDER else (b, a)
        assert 0 <= second[0] - first[-1] - 1 < 12  # The second follows the first.
    assert len(labels) > 800
    assert np.mean(labels) == pytest.approx(0.5, abs=0.05)


def test_empty_documents_are_skipped_and_single_segment_ones_are_cut_into_a_pair():
    documents, _ = _documents(20, seed=2)
    empty = np.zeros(0, np.int32)
    single = [np.arange(10**6, 10**6 + 15, dtype=np.int32)]
    for kind in ("nsp", "sop"):
        examples, stats = _build(kind, [[], [empty, empty], single, *documents])
        assert stats.documents == 23
        assert stats.empty_documents == 2
        assert stats.single_segment_documents == 1
        # The single segment is cut at a token into one pair: A its head, B the rest (SOP may swap them), or
        # (NSP, labelled random) B from another document.
        sides = slice(0, 1) if kind == "nsp" else slice(0, 2)  # A (NSP's random B may come from it too), or either
        from_single = [e for e in examples if single[0][0] in np.concatenate(_split(e)[sides])]
        assert len(from_single) == 1
        a, b = _split(from_single[0])
        if kind == "sop" and int(from_single[0]["sentence_order_label"]) == builders.SWAPPED:
            a, b = b, a
        assert a[0] == single[0][0] and np.all(np.diff(a) == 1) and len(a) < 15
        if kind == "nsp" and int(from_single[0]["next_sentence_label"]) == builders.RANDOM_NEXT:
            assert not np.isin(b, single[0]).any()
        else:
            assert np.array_equal(np.concatenate([a, b]), single[0])


def test_one_line_documents_give_pairs_with_half_of_them_true_next():
    """A JSONL corpus of one-line records under segmenter="line" (issue 50): every document is one segment, and
    NSP still gives one pair per document, B its true continuation or (about half) another document's text."""
    rng = np.random.default_rng(7)
    documents, where, next_id = [], {}, 5
    for d in range(600):
        length = int(rng.integers(20, 200))
        segment = np.arange(next_id, next_id + length, dtype=np.int32)
        where.update({int(t): d for t in segment})
        next_id += length
        documents.append([segment])
    examples, stats = _build("nsp", documents)
    assert stats.single_segment_documents == 600 and stats.examples == len(examples) == 600
    labels = []
    for example in examples:
        a, b = _split(example)
        label = int(example["next_sentence_label"])
        labels.append(label)
        same_document = where[int(a[0])] == where[int(b[0])]
        assert same_document == (label == builders.IS_NEXT)
        if label == builders.IS_NEXT:
            assert 0 <= b[0] - a[-1] - 1 < 200  # B continues A (truncation may cut the front of B).
    assert np.mean(labels) == pytest.approx(0.5, abs=0.06)


def test_a_builder_that_builds_nothing_says_why_and_names_the_keys():
    one_token = [[np.array([7], np.int32)] for _ in range(5)] + [[]]
    examples, stats = _build("nsp", one_token)
    assert not examples and stats.too_short_documents == 5 and stats.empty_documents == 1
    line = stats.why_no_examples("nsp")
    assert "config.data.example_builder='nsp' built no example from 6 document(s)" in line
    assert "1 empty" in line and "5 too short" in line
    assert "config.data.segmenter" in line and "config.data.example_builder" in line and "\n" not in line


def test_long_pairs_are_truncated_and_counted():
    long_segments = [[np.arange(5 + 100 * i + 1000 * d, 105 + 100 * i + 1000 * d) for i in range(4)]
                     for d in range(3)]
    examples, stats = _build("nsp", long_segments, short_seq_prob=0.0)
    assert stats.truncated_tokens > 0
    assert max((e["input_ids"] != SPECIALS.pad).sum() for e in examples) == MAX_SEQ_LENGTH


def _text(example):
    row = example["input_ids"]
    return row[row != SPECIALS.pad]


def test_full_sentences_keep_every_token_in_order_with_a_separator_between_documents():
    documents, where = _documents(40, seed=3)
    documents.append([np.arange(10**6, 10**6 + 150, dtype=np.int32)])  # Longer than a row.
    examples, stats = _build("full_sentences", documents)
    assert stats.split_segments == 2
    text = np.concatenate([_text(e)[1:-1] for e in examples])  # Without [CLS] ... [SEP].
    tokens = text[text != SPECIALS.sep]
    assert np.array_equal(tokens, np.concatenate([s for d in documents for s in d]))
    crossing = [e for e in examples if len({where.get(int(t)) for t in _text(e) if t > 4}) > 1]
    assert crossing  # Rows run on into the next document ...
    for example in crossing:  # ... with an extra [SEP] where a document ends.
        inner = _text(example)[1:-1]
        docs = np.array([where.get(int(t), -1) for t in inner])
        changes = np.flatnonzero(np.diff(docs[inner != SPECIALS.sep]) != 0)
        inner_seps = (inner[:-1] == SPECIALS.sep).sum()  # A last one closes the row's last document.
        assert len(changes) == inner_seps
    assert all(len(_text(e)) <= MAX_SEQ_LENGTH for e in examples)


def test_doc_sentences_never_cross_a_document():
    documents, where = _documents(40, seed=4)
    examples, _ = _build("doc_sentences", documents)
    for example in examples:
        inner = _text(example)[1:-1]
        assert SPECIALS.sep not in inner
        assert len({where[int(t)] for t in inner}) == 1
    assert np.array_equal(
        np.concatenate([_text(e)[1:-1] for e in examples]),
        np.concatenate([s for d in documents for s in d]),
    )


def test_packed_attention_never_crosses_documents_and_positions_restart():
    documents, where = _documents(60, seed=5)
    documents = [d[:3] for d in documents]  # Short documents: several per row.
    examples, _ = _build("packed", documents)
    batch = {k: np.stack([e[k] for e in examples]) for k in examples[0]}
    ids, segments, positions = batch["input_ids"], batch["segment_ids"], batch["position_ids"]
    assert segments.max() >= 3  # Rows really hold several documents.
    attention_mask = (ids != SPECIALS.pad).astype(np.int32)
    mask = attention_mask_from_batch(jnp.asarray(attention_mask), jnp.asarray(segments))
    allowed = np.asarray(allowed_keys(mask.segments, None))[:, 0]  # [B, query, key]
    doc = np.vectorize(lambda t: where.get(int(t), -1))(ids)
    for row in range(len(ids)):
        real = np.flatnonzero(segments[row] > 0)
        for q in real:
            keys = np.flatnonzero(allowed[row, q])
            assert set(segments[row, keys]) == {segments[row, q]}
            assert len({d for d in doc[row, keys] if d >= 0}) == 1
        for s in np.unique(segments[row][real]):
            where_s = np.flatnonzero(segments[row] == s)
            assert positions[row, where_s].tolist() == list(range(len(where_s)))
            assert ids[row, where_s[0]] == SPECIALS.cls and ids[row, where_s[-1]] == SPECIALS.sep
        assert np.all(ids[row, segments[row] == 0] == SPECIALS.pad)
    packed_tokens = np.concatenate([t[(t > SPECIALS.mask)] for t in ids])
    assert np.array_equal(packed_tokens, np.concatenate([s for d in documents for s in d]))


def test_packing_carry_round_trips_mid_row():
    documents, _ = _documents(30, seed=6)
    for kind in ("full_sentences", "packed"):
        straight, _ = _build(kind, documents)
        builder = builders.make_builder(_config(kind), SPECIALS)
        resumed = []
        for position, document in enumerate(documents):
            if position == 15:  # Rebuild from the JSON-able carry alone.
                carry = builder.carry()
                builder = builders.make_builder(_config(kind), SPECIALS)
                builder.set_carry(carry)
            resumed += builder.add_document(document, np.random.default_rng(position), position)
        resumed += builder.finish()
        assert len(resumed) == len(straight)
        assert all(np.array_equal(a[k], b[k]) for a, b in zip(straight, resumed) for k in a)


def test_unknown_builder_names_the_key():
    with pytest.raises(ValueError, match="config.data.example_builder='pairs'"):
        builders.make_builder(_config("pairs"), SPECIALS)
