"""`prepare`: shards + manifest that decode to the tokenizer's ids; resume; workers; the format."""

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

from data_pipelines.shards import prepare as prepare_lib
from data_pipelines.sources import prepared
from data_pipelines.sources import documents as sources
from data_pipelines.tokenizers import tokenizer as tokenizer_lib
from tests.test_data_sources import data_cfg


def write_corpus(directory, num_files=3, docs_per_file=12):
    directory.mkdir(exist_ok=True)
    for f in range(num_files):
        docs = [
            f"File {f} document {d} opens here.\nIt has a second sentence about topic {d % 5}.\n"
            f"A third line, number {d * 7}, closes it.\n"
            for d in range(docs_per_file)
        ]
        (directory / f"part{f}.txt").write_text("\n".join(docs))
    return directory


def corpus_cfg(path):
    cfg = data_cfg(source="text", path=str(path), vocab_size=300)
    cfg.tokenizer.min_frequency = 1
    return cfg


def run_prepare(cfg, out, **kwargs):
    kwargs = {"docs_per_shard": 5, "num_parts": 2, **kwargs}
    return prepare_lib.prepare(cfg, str(out), **kwargs)


def shard_documents(out, manifest):
    from array_record.python.array_record_module import ArrayRecordReader

    for shard in manifest["shards"]:
        reader = ArrayRecordReader(os.path.join(out, shard["path"]))
        yield from (prepared.decode_document(r) for r in reader.read_all())
        reader.close()


def direct_documents(cfg, tokenizer, num_parts):
    for part in range(num_parts):
        for document in sources.iter_documents(cfg, shard_index=part, shard_count=num_parts):
            yield tokenizer.encode_ids(document)


def assert_same_documents(got, want):
    got, want = list(got), list(want)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_record_encoding_round_trips_and_rejects_damage():
    document = [np.array([5, 6, 7], np.int32), np.array([], np.int32), np.array([2**31 - 1], np.int32)]
    decoded = prepared.decode_document(prepared.encode_document(document))
    assert [d.tolist() for d in decoded] == [[5, 6, 7], [], [2**31 - 1]]
    assert all(d.dtype == np.int32 for d in decoded)
    assert list(prepared.decode_document(prepared.encode_document([]))) == []
    with pytest.raises(ValueError, match="lengths say"):
        prepared.decode_document(prepared.encode_document(document)[:-4])


def test_prepare_writes_shards_and_a_manifest_that_decode_to_direct_tokenization(tmp_path):
    cfg = corpus_cfg(write_corpus(tmp_path / "corpus"))
    (tmp_path / "corpus" / "zbad.txt").write_bytes(b"Valid line.\n\xff\xfe invalid\n")
    out = tmp_path / "out"
    manifest = run_prepare(cfg, out)
    tokenizer = tokenizer_lib.load_tokenizer(str(out / "tokenizer"))
    assert manifest == json.loads((out / prepared.MANIFEST_FILE).read_text())
    assert manifest["documents"] == 37 and manifest["skipped"] == {"invalid_utf8": 1}
    assert manifest["tokenizer"] == {
        "dir": "tokenizer", "kind": "wordpiece", "vocab_size": tokenizer.get_vocab_size()
    }
    assert all(s["documents"] <= 5 for s in manifest["shards"])
    assert_same_documents(shard_documents(out, manifest), direct_documents(cfg, tokenizer, 2))
    decoded = list(shard_documents(out, manifest))
    assert manifest["segments"] == sum(len(d) for d in decoded)
    assert manifest["tokens"] == sum(len(s) for d in decoded for s in d)

    prepared_cfg = data_cfg(source="prepared", path=str(out))
    assert sources.is_random_access(prepared_cfg)
    table = pickle.loads(pickle.dumps(sources.open_random_access(prepared_cfg)))  # As grain workers get it.
    assert_same_documents([table[i] for i in range(len(table))], decoded)
    # Training on the prepared source uses the tokenizer that made it.
    run_tokenizer = tokenizer_lib.prepare_tokenizer(prepared_cfg, str(tmp_path / "run_tok"))
    assert run_tokenizer.hf.get_vocab() == tokenizer.hf.get_vocab()


def test_resume_keeps_finished_shards_and_ends_with_the_same_manifest(tmp_path):
    cfg = corpus_cfg(write_corpus(tmp_path / "corpus"))
    (tmp_path / "corpus" / "part1.txt").open("ab").write(b"\n\xff bad line in a late shard\nTail.\n")
    out = tmp_path / "out"
    complete = run_prepare(cfg, out)
    # Simulate a kill inside part 1: its last shard unfinished, the part not marked done.
    part1 = [s["path"] for s in complete["shards"] if s["path"].startswith("part-00001")]
    last = part1[-1]
    os.remove(out / prepare_lib.PROGRESS_DIR / f"{last}.json")
    os.remove(out / prepare_lib.PROGRESS_DIR / "part-00001.json")
    os.rename(out / last, out / f".{last}.tmp")
    os.remove(out / prepared.MANIFEST_FILE)
    kept = {p: os.stat(out / p).st_mtime_ns for p in part1[:-1]}

    resumed = run_prepare(cfg, out)
    assert resumed == complete
    assert {p: os.stat(out / p).st_mtime_ns for p in part1[:-1]} == kept  # Not rewritten.
    assert os.path.exists(out / last) and not os.path.exists(out / f".{last}.tmp")


def test_resume_with_other_settings_is_refused_naming_them(tmp_path):
    cfg = corpus_cfg(write_corpus(tmp_path / "corpus", num_files=1, docs_per_file=3))
    run_prepare(cfg, tmp_path / "out")
    with pytest.raises(ValueError, match="docs_per_shard: \\[5\\] there, \\[9\\] now"):
        run_prepare(cfg, tmp_path / "out", docs_per_shard=9)


def test_missing_source_fails_before_anything_is_written(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.data.path=.*the glob matches no files"):
        run_prepare(corpus_cfg(tmp_path / "none" / "*.txt"), tmp_path / "out")
    assert not os.path.exists(tmp_path / "out")


def test_worker_processes_write_the_same_shards_as_one_process(tmp_path):
    cfg = corpus_cfg(write_corpus(tmp_path / "corpus", num_files=4))
    one = run_prepare(cfg, tmp_path / "one")
    tokenizer_lib.copy_tokenizer(str(tmp_path / "one" / "tokenizer"), str(tmp_path / "two" / "tokenizer"))
    two = run_prepare(cfg, tmp_path / "two", num_workers=2)
    assert two["shards"] == one["shards"]
    assert_same_documents(shard_documents(tmp_path / "two", two), shard_documents(tmp_path / "one", one))


def test_command_line_prepares_a_jsonl_source(tmp_path):
    rows = [{"text": f"Record {i} first.\nRecord {i} second."} for i in range(30)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    subprocess.run(
        [
            sys.executable, "-m", "bert_jax.commands.prepare", "--config=configs/tiny.py", f"--out={out}",
            "--config.data.source=jsonl", f"--config.data.path={tmp_path / 'd.jsonl'}",
            "--config.model.vocab_size=200", "--config.data.tokenizer.min_frequency=1",
            "--num_workers=2", "--docs_per_shard=8",
        ],
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True,
    )
    manifest = prepared.read_manifest(str(out))
    assert manifest["documents"] == 30 and manifest["segments"] == 60
