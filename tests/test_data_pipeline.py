"""The grain pipeline: layout, exact resume (random access and streams), host shares, eval."""

import json

import numpy as np
import pytest

import bert_jax
from bert_jax.configs import base
from data_pipelines.examples import builders
from data_pipelines.sources import corpus, documents as sources
from data_pipelines.loader import pipeline, stream
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

BATCH = 8


@pytest.fixture(scope="module")
def cfg():
    config = base.get_config().data.copy_and_resolve_references()
    config.vocab_size = 2048  # Trains in about a second.
    config.max_seq_length = 64  # max_predictions_per_seq: auto, 10
    config.shuffle_window = 16
    config.tokenizer.sample_bytes = 300_000
    return config


@pytest.fixture(scope="module")
def tokenizer(cfg, tmp_path_factory):
    return tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path_factory.mktemp("tokenizer")))


@pytest.fixture(scope="module")
def jsonl_cfg(cfg, tmp_path_factory):
    """The first 80 embedded documents as a JSONL file: a streaming source."""
    path = tmp_path_factory.mktemp("jsonl") / "docs.jsonl"
    with open(path, "w") as f:
        for _, document in zip(range(80), corpus.embedded_documents()):
            f.write(json.dumps({"text": "\n".join(document)}) + "\n")
    config = cfg.copy_and_resolve_references()
    config.source, config.path, config.segmenter = "jsonl", str(path), "line"
    return config


def _unmasked(batch):
    """[B, L] original ids: input_ids with the masked positions' originals put back."""
    ids = batch["input_ids"].copy()
    rows, cols = np.nonzero(batch["masked_weights"])
    ids[rows, batch["masked_positions"][rows, cols]] = batch["masked_ids"][rows, cols]
    return ids


def _take(iterator, count):
    return [next(iterator) for _ in range(count)]


def _same(batches_a, batches_b):
    return len(batches_a) == len(batches_b) and all(
        np.array_equal(a[k], b[k]) for a, b in zip(batches_a, batches_b) for k in a
    )


def _iterator(config, tokenizer, seed=0, **kwargs):
    return pipeline.build_train_iterator(config, tokenizer, seed=seed, per_host_batch_size=BATCH, **kwargs)


@pytest.mark.parametrize("builder", ["nsp", "sop", "full_sentences", "packed"])
def test_batches_have_the_layout_batch_spec_describes(jsonl_cfg, tokenizer, builder):
    config = jsonl_cfg.copy_and_resolve_references()
    config.example_builder = builder
    config.masking = "whole_word"
    batch = next(_iterator(config, tokenizer))
    spec = pipeline.batch_spec(config, BATCH)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        k: (shape, np.dtype(dtype)) for k, (shape, dtype) in spec.items()
    }
    pad, cls = tokenizer.token_to_id("[PAD]"), tokenizer.token_to_id("[CLS]")
    original = _unmasked(batch)
    assert np.array_equal(batch["attention_mask"], (original != pad).astype(np.int32))
    assert np.all(original[:, 0] == cls)
    assert np.all(batch["masked_weights"].sum(axis=1) >= 1)


@pytest.mark.parametrize("source", ["embedded", "jsonl"])
@pytest.mark.parametrize("builder", ["nsp", "packed"])
def test_resumed_iterator_yields_identical_batches(cfg, jsonl_cfg, tokenizer, source, builder):
    config = (cfg if source == "embedded" else jsonl_cfg).copy_and_resolve_references()
    config.example_builder = builder
    iterator = _iterator(config, tokenizer)
    _take(iterator, 5)  # Mid-epoch, mid-document, mid-window.
    state = iterator.get_state()
    expected = _take(iterator, 4)
    resumed = _iterator(config, tokenizer)
    resumed.set_state(state)
    assert _same(_take(resumed, 4), expected)


def test_a_stream_resumes_identically_across_its_epoch_boundary(jsonl_cfg, tokenizer):
    config = jsonl_cfg.copy_and_resolve_references()
    config.example_builder = "full_sentences"
    iterator = _iterator(config, tokenizer)
    states, batches = [], []
    for _ in range(40):  # The 80 documents fill ~25 batches: this crosses into epoch 2.
        states.append(iterator.get_state())
        batches.append(next(iterator))
    for step in (23, 29):
        resumed = _iterator(config, tokenizer)
        resumed.set_state(states[step])
        assert _same(_take(resumed, 3), batches[step : step + 3])


def test_each_epoch_remasks_the_same_examples(jsonl_cfg, tokenizer):
    config = jsonl_cfg.copy_and_resolve_references()
    config.example_builder, config.shuffle_window = "doc_sentences", 1  # Same rows every epoch.
    feed = pipeline.document_feed(config, tokenizer, split="train", shuffle_seed=None, shard_index=0,
                                  shard_count=1, stats=sources.SkipStats())
    builder = builders.make_builder(config, tokenizer_lib.special_ids(tokenizer))
    per_epoch = sum(len(builder.add_document(d, None, p)) for p, d in feed.open(0, 0))
    iterator = _iterator(config, tokenizer)
    batches = _take(iterator, 2 * per_epoch // BATCH + 1)
    rows = np.concatenate([_unmasked(b) for b in batches])
    masks = np.concatenate([b["masked_positions"] for b in batches])
    assert np.array_equal(rows[:per_epoch], rows[per_epoch : 2 * per_epoch])
    same_mask = np.all(masks[:per_epoch] == masks[per_epoch : 2 * per_epoch], axis=1)
    assert same_mask.mean() < 0.05


def _documents(feed):
    return [tuple(np.concatenate(d)) for _, d in feed.open(0, 0) if d]


def test_hosts_get_disjoint_shares_that_cover_the_data(jsonl_cfg, tokenizer):
    documents = [d for _, d in zip(range(60), corpus.embedded_documents())]
    random_access = [
        stream.RandomAccessFeed(documents, np.arange(60), tokenizer.encode_ids, shard_index=host,
                                shard_count=count, shuffle_seed=7)
        for host, count in ((0, 2), (1, 2), (0, 1))
    ]
    # A stream's split is by position in the shard: compare both splits together.
    streams = [
        [pipeline.document_feed(jsonl_cfg, tokenizer, split=split, shuffle_seed=None, shard_index=host,
                                shard_count=count, stats=sources.SkipStats()) for split in ("train", "eval")]
        for host, count in ((0, 2), (1, 2), (0, 1))
    ]
    for host_0, host_1, whole in (
        [_documents(f) for f in random_access],
        [_documents(train) + _documents(held_out) for train, held_out in streams],
    ):
        assert abs(len(host_0) - len(host_1)) <= 1 and host_0 and host_1
        assert not set(host_0) & set(host_1)
        assert sorted(host_0 + host_1) == sorted(whole)


def test_train_and_eval_documents_are_disjoint(cfg, tokenizer):
    documents = {}
    for split in ("train", "eval"):
        feed = pipeline.document_feed(cfg, tokenizer, split=split, shuffle_seed=None, shard_index=0,
                                      shard_count=1, stats=sources.SkipStats())
        documents[split] = {tuple(np.concatenate(d)) for _, d in feed.open(0, 0) if d}
    assert documents["eval"] and not documents["train"] & documents["eval"]


def test_same_seed_gives_same_batches_and_another_seed_does_not(cfg, tokenizer):
    first = _take(_iterator(cfg, tokenizer, seed=3), 2)
    again = _take(_iterator(cfg, tokenizer, seed=3), 2)
    other = _take(_iterator(cfg, tokenizer, seed=4), 2)
    assert _same(first, again)
    assert not np.array_equal(first[0]["input_ids"], other[0]["input_ids"])


def test_bad_host_index_is_named(cfg, tokenizer):
    with pytest.raises(ValueError, match="process_index=2"):
        _iterator(cfg, tokenizer, process_index=2, process_count=2)


def test_eval_batches_are_fixed_full_and_bounded(cfg, tokenizer):
    first = pipeline.build_eval_batches(cfg, tokenizer, seed=0, per_host_batch_size=BATCH)
    again = pipeline.build_eval_batches(cfg, tokenizer, seed=0, per_host_batch_size=BATCH)
    assert len(first) == cfg.num_eval_batches
    assert _same(first, again)
    hosts = [
        pipeline.build_eval_batches(cfg, tokenizer, seed=0, per_host_batch_size=BATCH, process_index=i,
                                    process_count=2)
        for i in (0, 1)
    ]
    assert len(hosts[0]) == len(hosts[1]) > 0
    assert not np.array_equal(hosts[0][0]["input_ids"], hosts[1][0]["input_ids"])
    assert 0.0 < pipeline.most_frequent_token_accuracy(first) < 0.2


def test_too_small_eval_split_says_which_key_to_raise(cfg, tokenizer):
    with pytest.raises(ValueError, match="eval_fraction"):
        pipeline.build_eval_batches(cfg, tokenizer, seed=0, per_host_batch_size=100_000)


def test_most_frequent_token_accuracy_weights_positions():
    batches = [
        {"masked_ids": np.array([[7, 7, 9, 0]]), "masked_weights": np.array([[1.0, 1, 1, 0]])},
        {"masked_ids": np.array([[9, 5, 0, 0]]), "masked_weights": np.array([[1.0, 1, 0, 0]])},
    ]
    assert pipeline.most_frequent_token_accuracy(batches) == pytest.approx(2 / 5)


def test_skipped_training_records_reach_the_log_with_their_reasons(jsonl_cfg, tokenizer, tmp_path, caplog):
    good = open(jsonl_cfg.path, "rb").read().splitlines(keepends=True)[:12]
    path = tmp_path / "with_bad.jsonl"
    path.write_bytes(b"".join(good) + b'{"text": "\xff\xfe broken utf-8"}\n{"txt": "no text field"}\nnot json\n')
    config = jsonl_cfg.copy_and_resolve_references()
    config.path, config.prefetch_buffer_size = str(path), 0
    config.example_builder = "full_sentences"
    caplog.set_level("INFO", logger="absl")
    iterator = _iterator(config, tokenizer)
    while iterator.get_state()["parent"]["parent_window_start_state"]["epoch"] < 2:
        next(iterator)
    report = [r.getMessage() for r in caplog.records if "training data, epoch 0 done" in r.getMessage()]
    assert len(report) == 1
    for reason in ("invalid_utf8", "missing_field", "invalid_json"):
        assert f"{reason}" in report[0], report[0]


def test_worker_processes_hand_over_exactly_the_batches_they_built(cfg, tokenizer):
    """Two grain workers: each batch crosses as one packed array and arrives with the examples of
    the same worker's slice built in this process (grain takes the workers' batches in turn; a
    worker draws masks from its own element count); the iterator state resumes across workers."""
    from grain._src.python.dataset.transformations import prefetch  # noqa: PLC0415

    config = cfg.copy_and_resolve_references()
    with config.ignore_type():  # worker_count's default is "auto": a copy holds it as a str field
        config.worker_count, config.prefetch_buffer_size = 2, 1
    iterator = _iterator(config, tokenizer)
    batches = _take(iterator, 4)
    state = iterator.get_state()
    expected_next = _take(iterator, 2)

    single = cfg.copy_and_resolve_references()
    single.prefetch_buffer_size = 0
    slices = []
    for worker in range(2):
        dataset = pipeline.train_dataset(single, tokenizer, seed=0, per_host_batch_size=BATCH)
        prefetch._set_slice_iter_dataset(dataset, slice(worker, None, 2), False)  # noqa: SLF001
        slices.append(_take(iter(dataset), 3))
    for got, want in zip(batches + expected_next, [slices[i % 2][i // 2] for i in range(6)]):
        assert np.array_equal(_unmasked(got), _unmasked(want))
        for key in ("attention_mask", "token_type_ids", "next_sentence_label"):
            assert np.array_equal(got[key], want[key]), key
        assert np.array_equal(got["masked_weights"].sum(axis=1), want["masked_weights"].sum(axis=1))
    spec = pipeline.batch_spec(config, BATCH)
    assert {k: (v.shape, v.dtype) for k, v in batches[0].items()} == {
        k: (shape, np.dtype(dtype)) for k, (shape, dtype) in spec.items()
    }

    resumed = _iterator(config, tokenizer)
    resumed.set_state(state)
    assert _same(_take(resumed, 2), expected_next)


def test_one_line_records_train_under_nsp_and_records_that_build_nothing_say_why(cfg, tokenizer, tmp_path):
    """Issue 50: JSONL records with no line break under segmenter="line" are documents of one segment; NSP still
    builds pairs from them. Records too short for any pair end the run with the line that names the fixing keys."""
    path = tmp_path / "one_line.jsonl"
    with open(path, "w") as f:
        for _, document in zip(range(80), corpus.embedded_documents()):
            f.write(json.dumps({"text": " ".join(document)}) + "\n")
    config = cfg.copy_and_resolve_references()
    config.source, config.path, config.segmenter, config.example_builder = "jsonl", str(path), "line", "nsp"
    config.eval_fraction = 0.2
    labels = np.concatenate([b["next_sentence_label"] for b in _take(_iterator(config, tokenizer), 4)])
    assert 0 < labels.sum() < len(labels)  # both labels
    assert pipeline.build_eval_batches(config, tokenizer, seed=0, per_host_batch_size=BATCH)
    with open(path, "w") as f:
        f.writelines(json.dumps({"text": "the"}) + "\n" for _ in range(40))
    why = r"example_builder='nsp' built no example from \d+ document\(s\) \(\d+ too short.*config.data.segmenter"
    with pytest.raises(bert_jax.UserError, match=why):
        pipeline.build_eval_batches(config, tokenizer, seed=0, per_host_batch_size=BATCH)
    with pytest.raises(bert_jax.UserError, match=why):
        next(_iterator(config, tokenizer))
