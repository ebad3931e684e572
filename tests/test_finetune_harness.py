"""Fine-tuning run by the harness of every run: several hosts, preemption, and a workdir in a bucket."""
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import pytest

import finetune_data as fd
from bert_jax.finetune.run import finetune
from bert_jax.storage import paths
from bert_jax.storage.preflight import StorageError
from bert_jax.run.completion import read_done
from bert_jax.launch.local import run_local
from numerics import REORDERED, assert_close
from test_finetune import micro_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("harness_inputs")
    return {"hf_dir": fd.write_tiny_hf_bert(str(d / "hf")),
            "train.csv": fd.write_csv(d / "train.csv", fd.sentiment_rows(128, 0)),
            "test.csv": fd.write_csv(d / "test.csv", fd.sentiment_rows(32, 1)),
            "xla_cache": str(d / "xla_cache")}


def command(workdir: str, inputs: dict, *flags: str) -> list[str]:
    """`python -m bert_jax.finetune` on the micro classification run: 8 steps, a checkpoint every 2."""
    return [sys.executable, "-m", "bert_jax.finetune", "--config=configs/finetune/classification.py",
            f"--workdir={workdir}", f"--config.init_from={inputs['hf_dir']}",
            f"--config.data.train={inputs['train.csv']}", f"--config.data.test={inputs['test.csv']}",
            "--config.data.max_seq_length=16", "--config.model.dropout_rate=0.1", "--config.train.batch_size=16",
            "--config.train.learning_rate=3e-3", "--config.train.epochs=1.0", "--config.train.log_every_steps=1",
            "--config.checkpoint.every_steps=2", "--config.checkpoint.max_to_keep=8",
            "--config.checkpoint.async_save=False", "--config.logging.plots=False", f"--config.compilation_cache_dir={inputs['xla_cache']}", *flags]


def read_rows(workdir) -> list[dict]:
    return [json.loads(line) for line in paths.path(str(workdir)).joinpath("metrics.jsonl").read_text().splitlines()]


def train_losses(workdir) -> list[tuple[int, float]]:
    return [(r["step"], r["train/loss"]) for r in read_rows(workdir) if "train/loss" in r]


def results(workdir) -> dict:
    return json.loads(paths.path(str(workdir)).joinpath("results.json").read_text())


def test_a_finetuning_workdir_in_a_missing_bucket_fails_before_anything_is_built_and_is_not_created(gcs, tmp_path):
    # The config's inputs are checked first (bert_jax/finetune/config_validation.py): they exist, though the bucket
    # refuses the run before a weight or row of them is read.
    source, train = tmp_path / "hf", tmp_path / "train.csv"
    source.mkdir()
    for name in ("config.json", "model.safetensors"):
        (source / name).write_text("{}")
    train.write_text("sentence,label\n")
    c = micro_config("classification", str(source), {"train.csv": str(train), "test.csv": ""})
    with pytest.raises(StorageError, match=r"gs://no-such-finetune-bucket/run"):
        finetune(c, "gs://no-such-finetune-bucket/run")
    assert not paths.path("gs://no-such-finetune-bucket").exists()


def test_an_empty_init_from_is_refused_before_the_workdir_is_made(tmp_path):
    c = micro_config("classification", "", {"train.csv": "", "test.csv": ""})
    with pytest.raises(ValueError, match="config.init_from is empty"):
        finetune(c, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # ~2 min: three runs of two processes or one, compiled once each shape
def test_two_processes_give_the_one_process_losses_and_resume_identically(inputs, tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    subprocess.run(command(one, inputs), cwd=REPO, check=True, capture_output=True, timeout=600)
    out = io.StringIO()
    assert run_local(command(two, inputs), num_processes=2, devices_per_process=1, out=out, timeout_s=600) == 0, \
        out.getvalue()[-4000:]
    single, double = train_losses(one), train_losses(two)
    assert [s for s, _ in single] == [s for s, _ in double] == list(range(1, 9))  # one writer: each step once
    assert_close([l for _, l in double], [l for _, l in single], REORDERED)  # gloo sums in another order
    assert_close(results(two)["test"]["accuracy"], results(one)["test"]["accuracy"], REORDERED)
    saved = sorted(int(d) for d in os.listdir(os.path.join(two, "checkpoints")) if d.isdigit())
    data_files = sorted(f for f in os.listdir(os.path.join(two, "checkpoints", str(saved[-1]), "data"))
                        if f.endswith(".json"))
    assert data_files == ["process_0-of-2.json", "process_1-of-2.json"]  # each host's iterator

    # Killed after step 4's checkpoint: the same command resumes there and ends as the straight run did.
    killed = str(tmp_path / "killed")
    shutil.copytree(two, killed)
    for step in saved:
        if step > 4:
            shutil.rmtree(os.path.join(killed, "checkpoints", str(step)))
    os.remove(os.path.join(killed, "results.json"))
    os.remove(os.path.join(killed, "DONE"))
    assert run_local(command(killed, inputs), num_processes=2, devices_per_process=1, out=out, timeout_s=600) == 0, \
        out.getvalue()[-4000:]
    assert "starting at step 4 of 8" in out.getvalue(), out.getvalue()[-4000:]
    assert train_losses(killed) == double  # bit for bit
    assert results(killed)["test"] == results(two)["test"]


@pytest.mark.slow  # ~1 min: three runs of one process
def test_sigterm_saves_and_exits_0_and_the_same_command_resumes_to_the_straight_result(inputs, tmp_path):
    straight, preempted = str(tmp_path / "straight"), str(tmp_path / "preempted")
    subprocess.run(command(straight, inputs), cwd=REPO, check=True, capture_output=True, timeout=600)
    proc = subprocess.Popen(command(preempted, inputs), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    log = []
    for line in proc.stderr:  # absl logs to stderr; the watch is on from this line
        log.append(line)
        if "starting at step" in line:
            break
    proc.send_signal(signal.SIGTERM)
    rest = []
    reader = threading.Thread(target=lambda: rest.extend(proc.stderr), daemon=True)
    reader.start()
    assert proc.wait(timeout=600) == 0
    reader.join()
    assert any("preempted: checkpoint of step" in line for line in rest), "".join(rest)[-3000:]
    assert not os.path.exists(os.path.join(preempted, "results.json"))
    assert read_done(preempted) is None
    stopped = max(int(d) for d in os.listdir(os.path.join(preempted, "checkpoints")) if d.isdigit())
    assert stopped < 8
    done = subprocess.run(command(preempted, inputs), cwd=REPO, check=True, capture_output=True, text=True,
                          timeout=600)
    assert f"starting at step {stopped} of 8" in done.stderr
    assert train_losses(preempted) == train_losses(straight)
    assert results(preempted)["test"] == results(straight)["test"]
    assert read_done(preempted)["step"] == 8 and read_done(preempted)["kind"] == "finetune"


@pytest.mark.slow  # ~40 s: two runs of one process
def test_a_finetuning_workdir_in_a_gs_bucket_gives_the_local_run(gcs, inputs, tmp_path):
    local, bucket = str(tmp_path / "local"), f"{gcs.new()}/run"
    subprocess.run(command(local, inputs), cwd=REPO, check=True, capture_output=True, timeout=600)
    subprocess.run(command(bucket, inputs), cwd=REPO, check=True, capture_output=True, timeout=600)
    assert train_losses(bucket) == train_losses(local)
    assert results(bucket)["test"] == results(local)["test"]
    assert paths.path(bucket).joinpath("checkpoints").exists() and paths.path(bucket).joinpath("tokenizer").exists()
