"""The grain pipeline: shapes, dynamic masks, exact resume, host sharding, fixed eval."""

import os

import numpy as np
import pytest

from data_pipelines import pipeline
from data_pipelines import tokenizer as tokenizer_lib

BATCH = 16


@pytest.fixture(scope="module")
def cfg():
    config = pipeline.default_data_config()
    config.vocab_size = 2048  # Trains in about a second.
    return config


@pytest.fixture(scope="module")
def tokenizer_dir(cfg, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tokenizer"))
    pipeline.prepare_tokenizer(cfg, directory)
    return directory


@pytest.fixture(scope="module")
def tokenizer(cfg, tokenizer_dir):
    return pipeline.prepare_tokenizer(cfg, tokenizer_dir)


@pytest.fixture(scope="module")
def special_ids(tokenizer):
    return tokenizer_lib.special_ids(tokenizer)


@pytest.fixture(scope="module")
def examples(cfg, tokenizer):
    examples, _ = pipeline.build_examples(cfg, tokenizer, split="train", seed=0)
    return examples


def _subset(examples, count):
    return {name: array[:count] for name, array in examples.items()}


def _unmasked(batch):
    """[B, L] original ids: input_ids with the masked positions' originals put back."""
    ids = batch["input_ids"].copy()
    rows, cols = np.nonzero(batch["masked_weights"])
    ids[rows, batch["masked_positions"][rows, cols]] = batch["masked_ids"][rows, cols]
    return ids


def _row_index(examples):
    return {row.tobytes(): i for i, row in enumerate(examples["input_ids"])}


def _take(iterator, count):
    return [next(iterator) for _ in range(count)]


def _same(batches_a, batches_b):
    return all(np.array_equal(a[k], b[k]) for a, b in zip(batches_a, batches_b) for k in a)


def _stream(examples, cfg, special_ids, seed=0, **kwargs):
    return iter(
        pipeline.train_dataset(
            examples, cfg, special_ids, seed=seed, per_host_batch_size=BATCH, **kwargs
        )
    )


def test_unknown_source_fails_naming_the_known_ones(cfg):
    bad = cfg.copy_and_resolve_references()
    bad.source = "wikipedia"
    with pytest.raises(ValueError, match=r"'wikipedia'.*\['embedded'\]"):
        list(pipeline.source_documents(bad))


def test_train_and_eval_documents_partition_the_source(cfg):
    documents = [tuple(d) for d in pipeline.source_documents(cfg)]
    train = [tuple(d) for d in pipeline.split_documents(documents, "train", cfg.eval_fraction)]
    held_out = [tuple(d) for d in pipeline.split_documents(documents, "eval", cfg.eval_fraction)]
    assert len(train) + len(held_out) == len(documents)
    assert not set(train) & set(held_out)
    assert len(held_out) > 0


def test_batches_have_the_documented_layout(cfg, tokenizer, special_ids):
    iterator = pipeline.build_train_iterator(cfg, tokenizer, seed=0, per_host_batch_size=BATCH)
    batch = next(iterator)
    length, predictions = cfg.max_seq_length, cfg.max_predictions_per_seq
    assert {k: (v.dtype, v.shape) for k, v in batch.items()} == {
        "input_ids": (np.int32, (BATCH, length)),
        "token_type_ids": (np.int32, (BATCH, length)),
        "attention_mask": (np.int32, (BATCH, length)),
        "masked_positions": (np.int32, (BATCH, predictions)),
        "masked_ids": (np.int32, (BATCH, predictions)),
        "masked_weights": (np.float32, (BATCH, predictions)),
        "next_sentence_label": (np.int32, (BATCH,)),
    }
    original = _unmasked(batch)
    assert np.array_equal(batch["attention_mask"], (original != special_ids.pad).astype(np.int32))
    assert np.all(original[:, 0] == special_ids.cls)
    assert np.all(batch["masked_weights"].sum(axis=1) >= 1)
    assert set(np.unique(batch["next_sentence_label"])) <= {0, 1}


def test_examples_mix_both_labels_evenly(examples):
    assert examples["next_sentence_label"].mean() == pytest.approx(0.5, abs=0.03)


def test_each_epoch_reshuffles_and_remasks(examples, cfg, special_ids):
    small = _subset(examples, 4 * BATCH)
    index = _row_index(small)
    iterator = _stream(small, cfg, special_ids)
    epochs = [_take(iterator, 4), _take(iterator, 4)]
    orders, masks = [], []
    for epoch in epochs:
        order, mask = [], {}
        for batch in epoch:
            for row, positions in zip(_unmasked(batch), batch["masked_positions"]):
                order.append(index[row.tobytes()])
                mask[order[-1]] = positions.tolist()
        orders.append(order)
        masks.append(mask)
    assert sorted(orders[0]) == sorted(orders[1]) == list(range(4 * BATCH))
    assert orders[0] != orders[1]
    same_mask = sum(masks[0][i] == masks[1][i] for i in range(4 * BATCH))
    assert same_mask <= 2  # Two 19-of-~120 draws almost never coincide.


def test_same_seed_gives_same_batches_and_another_seed_does_not(examples, cfg, special_ids):
    first = _take(_stream(examples, cfg, special_ids, seed=3), 3)
    again = _take(_stream(examples, cfg, special_ids, seed=3), 3)
    other = _take(_stream(examples, cfg, special_ids, seed=4), 3)
    assert _same(first, again)
    assert not np.array_equal(first[0]["input_ids"], other[0]["input_ids"])


@pytest.mark.parametrize("skip", [5, 9])  # Mid-epoch, and across the epoch boundary at 8.
def test_resumed_iterator_yields_identical_batches(examples, cfg, special_ids, skip):
    small = _subset(examples, 8 * BATCH + 3)
    iterator = _stream(small, cfg, special_ids)
    _take(iterator, skip)
    state = iterator.get_state()
    expected = _take(iterator, 4)
    resumed = _stream(small, cfg, special_ids)
    resumed.set_state(state)
    assert _same(_take(resumed, 4), expected)


def test_hosts_get_disjoint_shares_that_cover_the_data(examples, cfg, special_ids):
    small = _subset(examples, 4 * BATCH * 2)
    index = _row_index(small)
    seen = []
    for host in (0, 1):
        iterator = _stream(small, cfg, special_ids, process_index=host, process_count=2)
        seen.append({index[row.tobytes()] for b in _take(iterator, 4) for row in _unmasked(b)})
    assert len(seen[0]) == len(seen[1]) == 4 * BATCH
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(len(index)))


def test_bad_host_index_is_named(examples, cfg, special_ids):
    with pytest.raises(ValueError, match="process_index=2"):
        _stream(examples, cfg, special_ids, process_index=2, process_count=2)


def test_eval_batches_are_fixed_full_and_bounded(cfg, tokenizer):
    first = pipeline.build_eval_batches(cfg, tokenizer, seed=0, per_host_batch_size=BATCH)
    again = pipeline.build_eval_batches(cfg, tokenizer, seed=0, per_host_batch_size=BATCH)
    assert 0 < len(first) <= cfg.num_eval_batches
    assert _same(first, again)
    assert all(b["input_ids"].shape == (BATCH, cfg.max_seq_length) for b in first)
    hosts = [
        pipeline.build_eval_batches(
            cfg, tokenizer, seed=0, per_host_batch_size=BATCH, process_index=i, process_count=2
        )
        for i in (0, 1)
    ]
    assert len(hosts[0]) == len(hosts[1]) > 0
    assert not np.array_equal(hosts[0][0]["input_ids"], hosts[1][0]["input_ids"])
    baseline = pipeline.most_frequent_token_accuracy(first)
    assert 0.0 < baseline < 0.2


def test_too_small_eval_split_says_which_key_to_raise(cfg, tokenizer):
    with pytest.raises(ValueError, match="eval_fraction"):
        pipeline.build_eval_batches(cfg, tokenizer, seed=0, per_host_batch_size=100_000)


def test_most_frequent_token_accuracy_weights_positions():
    batches = [
        {"masked_ids": np.array([[7, 7, 9, 0]]), "masked_weights": np.array([[1.0, 1, 1, 0]])},
        {"masked_ids": np.array([[9, 5, 0, 0]]), "masked_weights": np.array([[1.0, 1, 0, 0]])},
    ]
    assert pipeline.most_frequent_token_accuracy(batches) == pytest.approx(2 / 5)


def test_prepare_tokenizer_reuses_a_saved_tokenizer(cfg, tokenizer_dir, tokenizer):
    path = os.path.join(tokenizer_dir, "tokenizer.json")
    written = os.path.getmtime(path)
    reloaded = pipeline.prepare_tokenizer(cfg, tokenizer_dir)
    assert os.path.getmtime(path) == written
    assert reloaded.get_vocab() == tokenizer.get_vocab()
    assert tokenizer.get_vocab_size() == cfg.vocab_size
