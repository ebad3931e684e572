"""Streams visit their files in a seeded order, new each epoch, several at once, and resume at a cursor."""

import json
import pathlib

import numpy as np
import pytest

from bert_jax.configs import base
from data_pipelines.loader import file_order, pipeline
from data_pipelines.sources import corpus
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

FILES, DOCS = 8, 12


def _document(f, d):
    words = " ".join(f"w{(f * 31 + d * 7 + k) % 97}" for k in range(30))
    return f"file{f} opens document {d}.\n{words}\nfile{f} closes document {d}."


@pytest.fixture(scope="module")
def stream_cfg(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    for f in range(FILES):
        (root / f"part{f:02d}.txt").write_text("\n\n".join(_document(f, d) for d in range(DOCS)))
    cfg = base.get_config().data
    cfg.source, cfg.path = "text", str(root)
    cfg.vocab_size = 300
    cfg.max_seq_length = 32
    cfg.max_predictions_per_seq = 5
    cfg.shuffle_window = 1
    cfg.eval_fraction = 0.1
    cfg.tokenizer.min_frequency = 1
    return cfg


@pytest.fixture(scope="module")
def tokenizer(stream_cfg, tmp_path_factory):
    return tokenizer_lib.prepare_tokenizer(stream_cfg, str(tmp_path_factory.mktemp("tokenizer")))


def _file_of(tokenizer, document):
    """Which file a tokenized document came from: its first segment names it (`fileK opens ...`)."""
    ids = list(document[0])
    return next(f for f in range(FILES) if tokenizer.token_to_id(f"file{f}") in ids)


def _feed(cfg, tokenizer, split="train", seed=7):
    return pipeline.document_feed(cfg, tokenizer, split=split, shuffle_seed=seed if split == "train" else None,
                                  shard_index=0, shard_count=1, stats=pipeline.sources.SkipStats())


def test_an_epoch_reads_several_files_at_once_in_an_order_drawn_from_the_seed(stream_cfg, tokenizer):
    feed = _feed(stream_cfg, tokenizer)
    first = [_file_of(tokenizer, d) for _, d in list(feed.open(0, 0))[:8]]
    assert len(set(first)) == file_order.CYCLE_LENGTH  # interleaved, not one file after another
    assert feed.file_order(0) != feed.file_order(1) != list(range(FILES))
    assert sorted(feed.file_order(0)) == list(range(FILES))
    assert _feed(stream_cfg, tokenizer, seed=8).file_order(0) != feed.file_order(0)
    # Every document of the split once per epoch, whatever the order.
    epoch0 = sorted(tuple(np.concatenate(d)) for _, d in feed.open(0, 0))
    epoch1 = sorted(tuple(np.concatenate(d)) for _, d in feed.open(1, 0))
    assert epoch0 == epoch1


def test_the_held_out_documents_do_not_move_with_the_order(stream_cfg, tokenizer):
    def texts(feed, epoch):
        return {tuple(np.concatenate(d)) for _, d in feed.open(epoch, 0)}

    train = _feed(stream_cfg, tokenizer)
    held_out = texts(_feed(stream_cfg, tokenizer, split="eval"), 0)
    assert held_out and not held_out & texts(train, 0) and not held_out & texts(train, 1)
    expected = sum(corpus.is_eval_document(corpus.file_document_id(f, d), 0.1)
                   for f in range(FILES) for d in range(DOCS))
    assert len(held_out) == expected


def test_a_stream_resumes_at_its_cursor_without_reading_finished_files(stream_cfg, tokenizer, tmp_path):
    cfg = stream_cfg.copy_and_resolve_references()
    for f in range(FILES):  # a copy of the corpus that this test may overwrite
        name = f"part{f:02d}.txt"
        (tmp_path / name).write_text((pathlib.Path(stream_cfg.path) / name).read_text())
    cfg.path = str(tmp_path)
    cfg.nsp_reservoir_docs = 2  # NSP replays its ring of recent documents from the ring's first one
    iterator = pipeline.build_train_iterator(cfg, tokenizer, seed=1, per_host_batch_size=4)
    for _ in range(30):  # past the first CYCLE_LENGTH files, within the epoch
        next(iterator)
    state = json.loads(json.dumps(iterator.get_state()))
    straight = [next(iterator) for _ in range(6)]
    cursor = _find_cursor(state)
    order = pipeline.document_feed(cfg, tokenizer, split="train", shuffle_seed=pipeline._host_seed(1, 0, 0),
                                   shard_index=0, shard_count=1, stats=pipeline.sources.SkipStats()).file_order(0)
    open_files = {o for o, _ in cursor["open"]}
    finished = [order[o] for o in range(cursor["next_file"]) if o not in open_files]
    assert finished, cursor  # the point is past whole files
    for f in finished:  # a resume that re-read them would build other examples
        (tmp_path / f"part{f:02d}.txt").write_text("one other document")  # fewer documents: positions move
    resumed = pipeline.build_train_iterator(cfg, tokenizer, seed=1, per_host_batch_size=4)
    resumed.set_state(state)
    again = [next(resumed) for _ in range(6)]
    assert all(np.array_equal(a[k], b[k]) for a, b in zip(straight, again) for k in a)


def _find_cursor(state):
    """The ExampleStream's cursor inside the pipeline's nested iterator state."""
    if isinstance(state, dict):
        if "cursor" in state and "replay_from" in state:
            return state["cursor"]
        for value in state.values():
            found = _find_cursor(value)
            if found is not None:
                return found
    if isinstance(state, list):
        for value in state:
            found = _find_cursor(value)
            if found is not None:
                return found
    return None
