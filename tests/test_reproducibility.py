"""A run is a function of its config, data and seed: the same command twice logs the same losses,
and a resume on changed data stops instead of silently continuing another run."""
import json
import os

import jax
import pytest

from bert_jax.train.loop import train_and_evaluate
from bert_jax.run.run_identity import DataChangedError, check_resume
from data_pipelines.tokenizers import tokenizer as tokenizer_lib
from tests.test_data_tokenizer import sample_lines
from tests.test_pretrain import micro_config, read_metrics


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    """~250 KB of prose that ships with Python, as documents of 10 lines."""
    lines = sample_lines()
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join("\n".join(lines[i:i + 10]) for i in range(0, len(lines), 10)))
    return path


def text_config(corpus_file):
    """test_pretrain's micro config (the same compiled programs) on a corpus file."""
    c = micro_config()
    c.data.source, c.data.path = "text", str(corpus_file)
    return c


@pytest.fixture(scope="module")
def two_fresh_runs(xla_compile_cache, corpus_file, tmp_path_factory):
    """The same config run twice to step 4 of 8, each in a fresh workdir that trains its own tokenizer."""
    workdirs = [str(tmp_path_factory.mktemp(f"run{i}")) for i in range(2)]
    for workdir in workdirs:
        train_and_evaluate(text_config(corpus_file), workdir, stop_at_step=4)
    return workdirs


def without_timings(rows):
    """Rows less what the wall clock measures (perf/ and the time split time/), which no two runs share."""
    return [{k: v for k, v in row.items() if not k.startswith(("perf/", "time/"))} for row in rows]


def test_same_command_in_two_fresh_workdirs_logs_bit_identical_losses(two_fresh_runs):
    first, second = (read_metrics(w) for w in two_fresh_runs)
    assert [r["step"] for r in first if "train/loss" in r] == [1, 2, 3, 4]
    assert any("eval/loss" in r for r in first)
    assert without_timings(first) == without_timings(second)  # float equality: bit for bit
    hashes = [tokenizer_lib.tokenizer_hash(os.path.join(w, "tokenizer")) for w in two_fresh_runs]
    assert hashes[0] == hashes[1]


def test_config_json_records_the_run_identity(two_fresh_runs, corpus_file):
    identity = json.load(open(os.path.join(two_fresh_runs[0], "config.json")))["run_identity"]
    assert identity["tokenizer_sha256"] == tokenizer_lib.tokenizer_hash(os.path.join(two_fresh_runs[0], "tokenizer"))
    assert identity["data"]["source"] == "text"
    assert identity["data"]["files"] == [
        {"path": str(corpus_file), "size": corpus_file.stat().st_size, "mtime": int(corpus_file.stat().st_mtime)}
    ]
    assert identity["packages"]["jax"] == jax.__version__
    assert "git_commit" in identity


def test_resume_on_a_changed_corpus_file_stops_before_its_first_step_naming_the_file(
    two_fresh_runs, corpus_file, caplog
):
    workdir = two_fresh_runs[0]
    rows_before = read_metrics(workdir)
    original = corpus_file.read_text()
    config = text_config(corpus_file)
    try:
        corpus_file.write_text(original + "\n\nA sentence added after the run started.\n")
        with pytest.raises(DataChangedError, match=f"data file {corpus_file} changed \\(size"):
            train_and_evaluate(config, workdir)
        assert read_metrics(workdir) == rows_before  # stopped before step 5, the first it would run
        config.allow_data_change = True
        train_and_evaluate(config, workdir, stop_at_step=5)
        assert f"config.allow_data_change=True: going on although data file {corpus_file} changed" in caplog.text
        assert [r["step"] for r in read_metrics(workdir) if "train/loss" in r] == [1, 2, 3, 4, 5]
    finally:
        corpus_file.write_text(original)


def test_a_changed_tokenizer_stops_a_resume_naming_its_folder():
    before = {"tokenizer_sha256": "a" * 64, "data": {"source": "embedded"}, "packages": {}, "git_commit": None}
    after = {**before, "tokenizer_sha256": "b" * 64}
    with pytest.raises(DataChangedError, match="the tokenizer in runs/x/tokenizer changed"):
        check_resume(before, after, "runs/x", allow_data_change=False)
    check_resume(before, after, "runs/x", allow_data_change=True)  # logs, goes on
    check_resume(None, after, "runs/x", allow_data_change=False)  # a fresh run has nothing to compare
