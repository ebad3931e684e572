"""Prepared shards in a bucket at pod scale: each host copies only the shards it reads, within a bound."""

import os

import numpy as np
import pytest

from bert_jax.storage import paths
from bert_jax.configs import base
from data_pipelines.loader import pipeline
from data_pipelines.tokenizers import tokenizer as tokenizer_lib
from test_data_loader_identity import WORDS, PIECES, documents, write_prepared, write_vocab

SHARDS, DOCS_PER_SHARD, BATCH = 4, 12, 4


@pytest.fixture(scope="module")
def bucket_corpus(gcs, tmp_path_factory):
    """A prepared corpus of 4 shards in the emulated gs:// bucket, and its tokenizer (local)."""
    local = tmp_path_factory.mktemp("prepared")
    docs = documents(SHARDS * DOCS_PER_SHARD)
    write_prepared(local, [docs[i * DOCS_PER_SHARD : (i + 1) * DOCS_PER_SHARD] for i in range(SHARDS)])
    write_vocab(local)
    remote = f"{gcs.new()}/prepared"
    for f in local.iterdir():
        if f.name != "vocab.txt":
            paths.copy_file(f, f"{remote}/{f.name}")
    sizes = {f"shard-{i}.array_record": (local / f"shard-{i}.array_record").stat().st_size for i in range(SHARDS)}
    return remote, tokenizer_lib.load_tokenizer(str(local / "vocab.txt")), sizes


def _config(path, cache_bytes):
    config = base.get_config().data.copy_and_resolve_references()
    config.vocab_size = 5 + WORDS + PIECES
    config.max_seq_length, config.shuffle_window = 32, 8  # max_predictions_per_seq: auto, 5
    config.example_builder, config.source, config.path = "full_sentences", "prepared", path
    config.shard_cache_bytes = cache_bytes
    return config


def _cached(cache):
    return {str(f.name): f.stat().length for _, _, f in paths.cached_files(paths.path(cache))}


def _read_an_epoch(config, tokenizer, host):
    iterator = pipeline.build_train_iterator(config, tokenizer, seed=0, per_host_batch_size=BATCH,
                                             process_index=host, process_count=2)
    return [next(iterator) for _ in range(12)]  # More than a host's 2 shards hold: every one is read.


def test_each_host_caches_only_its_own_shards_within_the_bound(bucket_corpus, tmp_path, monkeypatch):
    remote, tokenizer, sizes = bucket_corpus
    bound = sizes["shard-0.array_record"] + sizes["shard-2.array_record"] + 100
    bound = max(bound, sizes["shard-1.array_record"] + sizes["shard-3.array_record"] + 100)
    for host, mine in ((0, {"shard-0.array_record", "shard-2.array_record"}),
                       (1, {"shard-1.array_record", "shard-3.array_record"})):
        cache = tmp_path / f"host{host}"
        monkeypatch.setenv(paths.CACHE_ENV, str(cache))
        # A shard of another corpus, used long ago: the bound makes it go first.
        stale = cache / "0123456789abcdef" / "old-corpus-shard.array_record"
        stale.parent.mkdir(parents=True)
        stale.write_bytes(b"x" * 150)
        os.utime(stale, (1, 1))
        _read_an_epoch(_config(remote, bound), tokenizer, host)
        cached = _cached(cache)
        assert set(cached) == mine
        assert sum(cached.values()) <= bound
        assert cached == {name: sizes[name] for name in mine}


def test_hosts_read_disjoint_whole_shards_that_cover_the_corpus(bucket_corpus, tmp_path, monkeypatch):
    remote, tokenizer, _ = bucket_corpus
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    config = _config(remote, 0)
    feeds = [pipeline.document_feed(config, tokenizer, split="train", shuffle_seed=1, shard_index=host,
                                    shard_count=2, stats=None) for host in (0, 1)]
    shares = [feed.order(0, 0, 10**6) for feed in feeds]
    assert not set(shares[0].tolist()) & set(shares[1].tolist())
    shard_of = [set((share // DOCS_PER_SHARD).tolist()) for share in shares]
    assert shard_of == [{0, 2}, {1, 3}]
    all_train = pipeline._split_indices(SHARDS * DOCS_PER_SHARD, "train", config.eval_fraction)
    assert sorted(np.concatenate(shares).tolist()) == all_train.tolist()


def test_a_bound_below_a_hosts_shards_fails_naming_the_key(bucket_corpus, tmp_path, monkeypatch):
    remote, tokenizer, sizes = bucket_corpus
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="config.data.shard_cache_bytes"):
        _read_an_epoch(_config(remote, sizes["shard-0.array_record"] + 10), tokenizer, 0)
