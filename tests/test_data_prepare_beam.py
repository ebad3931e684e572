"""`prepare_beam`: the documents and counts of `prepare`, shards independent of the workers, bad input, refusals."""

import collections
import os
import re
import subprocess
import sys

import pytest

from bert_jax.storage import paths
from data_pipelines.shards import prepare_beam
from data_pipelines.sources.prepared import read_manifest
from data_pipelines.sources import documents as sources
from data_pipelines.tokenizers import tokenizer as tokenizer_lib
from tests.test_data_prepare import corpus_cfg, run_prepare, write_corpus

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO_PROCESSES = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
IN_MEMORY = ["--direct_num_workers=1", "--direct_running_mode=in_memory"]
BAD_INPUT = {"binary_file": 1, "invalid_utf8": 1, "empty_file": 1, "line_too_long": 1}
BAD_INPUT_SORTED = dict(sorted(BAD_INPUT.items()))


def shard_records(out, manifest):
    from array_record.python.array_record_module import ArrayRecordReader

    for shard in manifest["shards"]:
        reader = ArrayRecordReader(os.path.join(out, shard["path"]))
        yield from reader.read_all()
        reader.close()


def counts(manifest):
    return {k: manifest[k] for k in ("documents", "segments", "tokens", "skipped")}


def corpus_cfg_prepared(path):
    cfg = corpus_cfg(path)
    cfg.source = "prepared"
    return cfg


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """3 files of good documents, and one file of each kind of bad input."""
    directory = write_corpus(tmp_path_factory.mktemp("beam") / "corpus", num_files=3, docs_per_file=12)
    (directory / "binary.bin").write_bytes(b"\x00\x01\x02 not text" * 100)
    (directory / "latin1.txt").write_bytes(b"A good line before.\n\xe9t\xe9 in Latin-1\nA good line after.\n")
    (directory / "empty.txt").write_bytes(b"")
    (directory / "long_line.txt").write_bytes(b"Kept before the long line.\n" + b"x" * 7_000_000 + b"\nKept after.\n")
    return directory


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    """`prepare` and `prepare_beam` (2 worker processes) on the corpus, with one tokenizer."""
    root = tmp_path_factory.mktemp("prepared")
    cfg = corpus_cfg(corpus)
    by_prepare = run_prepare(cfg, root / "prepare")
    tokenizer_lib.copy_tokenizer(str(root / "prepare" / "tokenizer"), str(root / "beam" / "tokenizer"))
    by_beam = prepare_beam.prepare_beam(cfg, str(root / "beam"), TWO_PROCESSES, num_shards=3)
    return root, by_prepare, by_beam


def test_beam_and_prepare_give_the_same_documents_and_counts(prepared):
    root, by_prepare, by_beam = prepared
    assert counts(by_beam) == counts(by_prepare)
    beam_records = collections.Counter(shard_records(root / "beam", by_beam))
    assert beam_records == collections.Counter(shard_records(root / "prepare", by_prepare))
    assert sum(beam_records.values()) == by_beam["documents"] == 36 + 2  # 3 × 12, and one around each bad line
    table = sources.open_random_access(corpus_cfg_prepared(root / "beam"))  # What training reads.
    assert len(table) == by_beam["documents"]
    assert by_beam["tokenizer"] == by_prepare["tokenizer"] and by_beam["num_shards"] == 3


def test_bad_input_is_counted_by_reason_and_every_good_document_kept(prepared, corpus, tmp_path, caplog):
    root, by_prepare, by_beam = prepared
    assert by_beam["skipped"] == by_prepare["skipped"] == BAD_INPUT
    # Every good document kept: the same records as prepare's (test above); and in Beam's counters.
    tokenizer_lib.copy_tokenizer(str(root / "beam" / "tokenizer"), str(tmp_path / "tokenizer"))
    with caplog.at_level("INFO"):
        prepare_beam.prepare_beam(corpus_cfg(corpus), str(tmp_path), IN_MEMORY, num_shards=3)
    assert f"Beam counters: {BAD_INPUT_SORTED}" in caplog.text


def test_other_worker_and_part_counts_give_identical_shards(prepared, corpus, tmp_path):
    root, _, by_beam = prepared
    tokenizer_lib.copy_tokenizer(str(root / "beam" / "tokenizer"), str(tmp_path / "tokenizer"))
    again = prepare_beam.prepare_beam(corpus_cfg(corpus), str(tmp_path), IN_MEMORY, num_shards=3, num_parts=2)
    assert again == by_beam  # fingerprint included
    for shard in by_beam["shards"]:
        assert (tmp_path / shard["path"]).read_bytes() == (root / "beam" / shard["path"]).read_bytes()


@pytest.mark.parametrize("store, options", [("gcs", TWO_PROCESSES), ("s3", IN_MEMORY)])
def test_a_corpus_and_output_in_a_bucket_give_the_same_shards(prepared, corpus, store, options, request):
    root, _, by_beam = prepared
    bucket = request.getfixturevalue(store).new()  # Worker processes find the emulator through the environment.
    for file in corpus.iterdir():
        paths.copy_file(file, f"{bucket}/corpus/{file.name}")
    tokenizer_lib.copy_tokenizer(str(root / "beam" / "tokenizer"), f"{bucket}/prepared/tokenizer")
    in_bucket = prepare_beam.prepare_beam(
        corpus_cfg(f"{bucket}/corpus"), f"{bucket}/prepared", options, num_shards=3
    )
    assert {k: v for k, v in in_bucket.items() if k != "source"} == {k: v for k, v in by_beam.items() if k != "source"}
    for shard in by_beam["shards"]:
        assert paths.path(f"{bucket}/prepared/{shard['path']}").read_bytes() == (root / "beam" / shard["path"]).read_bytes()


def test_an_output_with_other_settings_is_refused_unless_overwrite(prepared, corpus, tmp_path):
    root, by_prepare, _ = prepared
    with pytest.raises(ValueError, match=r"holds a manifest with other settings \(engine, num_shards, "):
        prepare_beam.prepare_beam(corpus_cfg(corpus), str(root / "prepare"), IN_MEMORY, num_shards=3)
    assert read_manifest(str(root / "prepare")) == by_prepare  # untouched

    out = tmp_path / "out"
    tokenizer_lib.copy_tokenizer(str(root / "beam" / "tokenizer"), str(out / "tokenizer"))
    first = prepare_beam.prepare_beam(corpus_cfg(corpus), str(out), IN_MEMORY, num_shards=2)
    with pytest.raises(ValueError, match=r"num_shards: \[2\] there, \[1\] now.*--overwrite"):
        prepare_beam.prepare_beam(corpus_cfg(corpus), str(out), IN_MEMORY, num_shards=1)
    replaced = prepare_beam.prepare_beam(corpus_cfg(corpus), str(out), IN_MEMORY, num_shards=1, overwrite=True)
    assert counts(replaced) == counts(first) and len(replaced["shards"]) == 1
    assert sorted(p.name for p in out.glob("*.array_record")) == ["shard-00000-of-00001.array_record"]


@pytest.mark.parametrize(
    "option, error, message",
    [
        ("--runner=NoSuchRunner", ValueError, "Unexpected pipeline runner: NoSuchRunner"),
        ("--direct_num_wokers=2", ValueError, r"does not know the pipeline option\(s\) \['direct_num_wokers'\]"),
        ("--direct_running_mode=bogus", SystemExit, "invalid choice: 'bogus'"),
    ],
)
def test_a_runner_option_beam_rejects_fails_before_any_work(option, error, message, corpus, tmp_path, capsys):
    with pytest.raises(error) as raised:
        prepare_beam.prepare_beam(corpus_cfg(corpus), str(tmp_path / "out"), [option])
    assert re.search(message, str(raised.value) + capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_command_line_prepares_and_pretraining_on_the_shards_resumes_exactly(tmp_path):
    from bert_jax.train.loop import train_and_evaluate
    from tests.test_pretrain import micro_config, train_losses

    out = tmp_path / "prepared"
    subprocess.run(
        [
            sys.executable, "-m", "bert_jax.commands.prepare_beam", "--config=configs/tiny.py", f"--out={out}",
            "--config.data.source=embedded", "--config.model.vocab_size=1024", "--num_shards=4",
            "--direct_num_workers=2",
        ],
        check=True, cwd=REPO, capture_output=True,
    )
    manifest = read_manifest(str(out))
    assert manifest["documents"] > 100 and manifest["engine"] == "apache_beam"

    def config():
        c = micro_config()
        c.data.source, c.data.path = "prepared", str(out)
        return c

    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    train_and_evaluate(config(), straight)
    train_and_evaluate(config(), resumed, stop_at_step=4)
    train_and_evaluate(config(), resumed)
    assert [s for s, _ in train_losses(resumed)] == list(range(1, 9))
    assert train_losses(resumed) == train_losses(straight)  # bit for bit
    # Training read the shards' own tokenizer.
    assert (tmp_path / "straight" / "tokenizer" / "vocab.txt").read_text() == (out / "tokenizer" / "vocab.txt").read_text()
