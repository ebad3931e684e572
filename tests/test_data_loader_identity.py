"""The loader's batches are pinned: speed work on it must not change a single bit.

The digests below were computed by the loader before the issue 28 speed work, on a micro
prepared corpus built here from a seeded generator (no tokenizer training, no corpus
parsing), so they change only when the loader's output does. A digest that no longer
matches means batches changed for a fixed seed and step: runs would not repeat across
versions, and a checkpoint's data state would resume into other data.
"""

import json

import grain
import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter
from grain._src.python.experimental.index_shuffle.python.index_shuffle_module import index_shuffle

from bert_jax.configs import base
from data_pipelines import index_shuffle as index_shuffle_lib
from data_pipelines.loader import pipeline, stream
from data_pipelines.sources import prepared
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

BATCH, BATCHES = 4, 3
WORDS, PIECES = 200, 100

EXPECTED = {
    # (source, builder, masking): sha256 of the first BATCHES training batches, then of the eval batches.
    ('prepared', 'nsp', 'token'): ('2e409d839caf9f81124392f6a65869d33367e5d03c329b1b4d6fc19acf3bb0f5',
        'b2ca27dce2ea33cb62bcdb0a32b46c3dbad3848ba7fc3724d975e88cb85ff776'),
    ('prepared', 'nsp', 'whole_word'): ('214eb3e4410f626f71b6c38cfc55bc73ae5067267b658be568d81d54b1ec51a3',
        '18f0ae72e6cd2eac3614b0d9c2d2fbaafa6fbf64e208cc3dfae8814c83cdcfe6'),
    ('prepared', 'sop', 'ngram'): ('8897fcc7650a52dce04ec860c1a36593e085440707894ee2d44bc8454ee70a81',
        '71bb5c6a15d7ab8f77b9027d147ebaf43a100ffa40991e1fc4175a3ab4f0748b'),
    ('prepared', 'full_sentences', 'span'): ('791d277cf427ce09ff8fc20eaf7cabf5b06d5507aa8aa885e016a0fe6ff805ca',
        '94e070f45222d6ea68624940d947aed38f781b57ae13273f1f0b25163f67ecf8'),
    ('prepared', 'doc_sentences', 'token'): ('a36e109b0e885a76943f46f3a326d20d35398ec1cb2ee6bd67ac8796b12992cc',
        'ef6039e621f6e166a35c1982fb300c608702c1199ef8ca929fffbbae68926a20'),
    ('prepared', 'packed', 'whole_word'): ('55093b5f27e071495a6187841581bf8cd06a275643b700ca28752869131ccf44',
        '5627edf4fecd679b8f9fe5af93578883baca3f6628092a1f07eeb364023a8172'),
    # Re-pinned (issue 50): a document of one segment now gives an NSP pair instead of nothing.
    ('jsonl', 'nsp', 'token'): ('7e8f7af8fe4f354c1c9dd5217a45f0b4c6e496b94807a24154aa545244e10ec4',
        '6d4120cc84be287a2e981fdae93dca064638d0a52ac1481c4424b7ed8d33e04f'),
    ('jsonl', 'packed', 'token'): ('747e4b75f60ff825d18dae28b6d80bf35ce2cae6bf3b78978357334241390eae',
        'bb16b5548f06731051a571687ce85cedbbb7ffb5fa5771258d75f5aa29dfbde4'),
}


def documents(count=60):
    """`count` documents of 1-8 segments of 1-40 ids (words, some followed by ## pieces)."""
    rng = np.random.default_rng(28)
    documents = []
    for _ in range(count):
        segments = []
        for _ in range(int(rng.integers(1, 9))):
            ids = rng.integers(5, 5 + WORDS + PIECES, int(rng.integers(1, 41)))
            ids[0] = min(ids[0], 5 + WORDS - 1)  # A segment starts with a word.
            segments.append(ids.astype(np.int32))
        documents.append(segments)
    return documents


def write_vocab(root) -> list[str]:
    """root/vocab.txt: the specials, WORDS words and PIECES ## pieces; returns the tokens."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += [f"w{i}" for i in range(WORDS)] + [f"##p{i}" for i in range(PIECES)]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return vocab


def write_prepared(root, parts) -> None:
    """A prepared directory in `root`: one ArrayRecord shard per list of documents, and a manifest."""
    shards = []
    for number, part in enumerate(parts):
        name = f"shard-{number}.array_record"
        writer = ArrayRecordWriter(str(root / name), "group_size:1")
        for document in part:
            writer.write(prepared.encode_document(document))
        writer.close()
        shards.append({"path": name, "documents": len(part), "segments": 0, "tokens": 0})
    manifest = {"format": prepared.FORMAT, "documents": sum(map(len, parts)), "shards": shards}
    (root / prepared.MANIFEST_FILE).write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """A prepared directory (2 shards, manifest), its documents as JSONL, and a vocab.txt."""
    root = tmp_path_factory.mktemp("identity")
    vocab = write_vocab(root)
    docs = documents()
    write_prepared(root, [docs[:25], docs[25:]])
    with open(root / "docs.jsonl", "w") as f:
        for document in docs:
            text = "\n".join(" ".join(vocab[i] for i in s if i < 5 + WORDS) or "w0" for s in document)
            f.write(json.dumps({"text": text}) + "\n")
    return root


def _config(corpus_dir, source, builder, masking):
    config = base.get_config().data.copy_and_resolve_references()
    config.vocab_size = 5 + WORDS + PIECES
    config.max_seq_length = 32  # max_predictions_per_seq: auto, 5
    config.shuffle_window, config.eval_fraction, config.num_eval_batches = 8, 0.2, 1
    config.example_builder, config.masking = builder, masking
    if source == "prepared":
        config.source, config.path = "prepared", str(corpus_dir)
    else:
        config.source, config.path, config.field = "jsonl", str(corpus_dir / "docs.jsonl"), "text"
    return config


CASES = [
    ("prepared", "nsp", "token"),
    ("prepared", "nsp", "whole_word"),
    ("prepared", "sop", "ngram"),
    ("prepared", "full_sentences", "span"),
    ("prepared", "doc_sentences", "token"),
    ("prepared", "packed", "whole_word"),
    ("jsonl", "nsp", "token"),
    ("jsonl", "packed", "token"),
]


@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_batches_are_bit_identical_to_the_pinned_ones(corpus_dir, case):
    config = _config(corpus_dir, *case)
    tokenizer = tokenizer_lib.load_tokenizer(str(corpus_dir / "vocab.txt"))
    iterator = pipeline.build_train_iterator(config, tokenizer, seed=7, per_host_batch_size=BATCH)
    train = pipeline.batch_digest([next(iterator) for _ in range(BATCHES)])
    evaluation = pipeline.batch_digest(
        pipeline.build_eval_batches(config, tokenizer, seed=7, per_host_batch_size=BATCH))
    assert (train, evaluation) == EXPECTED[case]


@pytest.mark.parametrize("size", [1, 2, 100, 128, 1000, 1024, 5000])
def test_window_permutation_is_grains_index_shuffle(size):
    seed = 2**32 - 1 - size
    expected = [index_shuffle(i, max_index=max(size - 1, 0), seed=seed, rounds=4) for i in range(size)]
    assert index_shuffle_lib.permutation(size, seed).tolist() == expected


@pytest.mark.parametrize("size, shard, seed", [(50, (0, 1), 3), (1000, (1, 3), 2**32 - 2), (20000, (2, 4), 11)])
def test_document_order_is_grains_map_dataset_shuffle(size, shard, seed):
    indices = np.arange(size, dtype=np.int64) * 7
    feed = stream.RandomAccessFeed(np.arange(7 * size), indices, None, shard_index=shard[0], shard_count=shard[1],
                                   shuffle_seed=seed)
    grains = grain.MapDataset.source(indices)[shard[0] :: shard[1]].shuffle(seed=seed).repeat(None)
    per_epoch = len(indices[shard[0] :: shard[1]])
    for epoch in range(3):
        expected = [grains[epoch * per_epoch + p] for p in range(per_epoch)]
        assert feed.order(epoch, 0, per_epoch).tolist() == expected
        assert [d for _, d in feed.open(epoch, 5)] == expected[5:]


@pytest.mark.parametrize("hosts", [1, 2])
def test_prepared_source_resumes_identically(corpus_dir, hosts):
    config = _config(corpus_dir, "prepared", "nsp", "whole_word")
    tokenizer = tokenizer_lib.load_tokenizer(str(corpus_dir / "vocab.txt"))

    def iterator():
        return pipeline.build_train_iterator(config, tokenizer, seed=7, per_host_batch_size=BATCH,
                                             process_index=hosts - 1, process_count=hosts)

    original = iterator()
    for _ in range(9):  # Mid-epoch, mid-document, mid-window.
        next(original)
    state = original.get_state()
    expected = [next(original) for _ in range(4)]
    resumed = iterator()
    resumed.set_state(state)
    assert pipeline.batch_digest([next(resumed) for _ in range(4)]) == pipeline.batch_digest(expected)
