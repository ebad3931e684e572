"""A sweep file becomes one named run per point; `summary` tabulates and plots them."""
import csv
import json
import os
import subprocess
import sys

import pytest

from bert_jax.storage import paths
from data_pipelines.tokenizers import tokenizer as tokenizer_lib
from bert_jax.commands import sweep as sweep_command
from bert_jax.launch import executors, sweep

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from test_pretrain import micro_config  # noqa: E402


def test_grid_and_points_expand_to_named_runs(tmp_path):
    spec = dict(config="configs/tiny.py", overrides={"train.num_steps": 10},
                grid={"train.learning_rate": [1e-3, 2e-3], "model.num_layers": [1, 2]},
                points=[{"mesh.shape": (1, -1, 1)}])
    runs = sweep.plan_runs(spec, str(tmp_path))
    assert [r["name"] for r in runs] == [
        "learning_rate=0.001,num_layers=1", "learning_rate=0.001,num_layers=2",
        "learning_rate=0.002,num_layers=1", "learning_rate=0.002,num_layers=2", "shape=_1,-1,1_",
    ]
    assert runs[0]["argv"][-4:-1] == ["--config.train.num_steps=10", "--config.train.learning_rate=0.001",
                                      "--config.model.num_layers=1"]
    assert runs[-1]["argv"][-2] == "--config.mesh.shape=(1,-1,1)"
    assert runs[0]["workdir"] == os.path.join(str(tmp_path), "learning_rate=0.001,num_layers=1")


def test_colliding_names_and_empty_sweeps_are_refused(tmp_path):
    with pytest.raises(ValueError, match="both named"):
        sweep.plan_runs(dict(config="c", points=[{"a.lr": 1}, {"b.lr": 1}]), str(tmp_path))
    with pytest.raises(ValueError, match="no points"):
        sweep.plan_runs(dict(config="c"), str(tmp_path))


def test_tpu_executor_writes_sweep_json_first_and_prints_spot_slices_that_clone_the_repo_and_delete_when_done(
        gcs, capsys):
    sweep_dir = f"{gcs.new()}/sw"
    with pytest.raises(SystemExit) as exit_status:
        sweep_command.main(["run", "--sweep=configs/sweeps/tiny_lr.py", f"--sweep_dir={sweep_dir}", "--executor=tpu",
                    "--repo_url=https://github.com/lab/bert_jax.git"])
    assert exit_status.value.code == 0
    out = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert len(out) == 4
    assert out[0].startswith(f"bert-jax tokenizer --config=configs/tiny.py --out={sweep_dir}/tokenizers/")
    tokenizer = out[0].split("--out=")[1].split()[0]
    assert ("bert-jax tpu-vm all --name=sweep-0 --zone=us-central2-b --accelerator_type=v4-8 --spot "
            "--repo_url=https://github.com/lab/bert_jax.git --branch=main --delete_when_done") in out[1]
    assert f"--workdir={sweep_dir}/learning_rate=0.0005 -- --config.logging.wandb_group=sw" in out[1]
    assert all(line.endswith(f"--config.data.tokenizer.path={tokenizer}") for line in out[1:])
    record = json.loads(paths.path(f"{sweep_dir}/sweep.json").read_text())  # written before any point runs
    assert [r["name"] for r in record["runs"]] == ["learning_rate=0.0005", "learning_rate=0.002", "learning_rate=0.005"]
    table = sweep.summarize(sweep_dir)  # works before (and while) the points run
    assert [row["state"] for row in table] == ["pending"] * 3 and table[0]["eval/loss"] is None


def test_tpu_and_ray_executors_refuse_a_local_sweep_dir_and_a_placeholder_repo(tmp_path, capsys):
    for flags in (["--executor=tpu", "--repo_url=https://github.com/lab/bert_jax.git", f"--sweep_dir={tmp_path}"],
                  ["--executor=tpu", "--sweep_dir=gs://b/sw"],
                  ["--executor=ray", "--address=127.0.0.1:6379", "--tpu=v4-16", f"--sweep_dir={tmp_path}"]):
        with pytest.raises(SystemExit) as error:
            sweep_command.main(["run", "--sweep=configs/sweeps/tiny_lr.py", "--dry_run", *flags])
        refusal = capsys.readouterr().err.splitlines()
        assert error.value.code == 2 and len(refusal) == 1
        assert "gs:// or s3://" in refusal[0] or "--repo_url" in refusal[0]


def test_ray_executor_submits_every_point_as_a_ray_tpu_job(capsys):
    with pytest.raises(SystemExit):
        sweep_command.main(["run", "--sweep=configs/sweeps/tiny_lr.py", "--sweep_dir=gs://b/sw", "--executor=ray",
                    "--address=10.0.0.2:6379", "--tpu=v4-16", "--dry_run"])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and "-m bert_jax.commands.tokenizer" in out[0]
    assert all(f"-m bert_jax.commands.ray_tpu --address=10.0.0.2:6379 --tpu=v4-16 --command=bert_jax.commands.pretrain "
               f"--config=configs/tiny.py "
               f"--workdir=gs://b/sw/learning_rate={lr} --max_wait=86400.0 --python=python3 -- " in line
               for lr, line in zip(("0.0005", "0.002", "0.005"), out[1:]))
    assert all("--config.logging.wandb_run_name=learning_rate=" in line for line in out[1:])


def test_local_points_run_side_by_side_with_parallel(tmp_path):
    # Point a finishes only once point b has started: with --parallel=2 both run at once.
    wait = f"import os, time; [time.sleep(0.05) for _ in range(400) if not os.path.exists({str(tmp_path / 'b')!r})]; " \
           f"assert os.path.exists({str(tmp_path / 'b')!r}); print('a saw b')"
    points = [("a", [sys.executable, "-c", wait]),
              ("b", [sys.executable, "-c", f"open({str(tmp_path / 'b')!r}, 'w').close()"]),
              ("c", [sys.executable, "-c", "raise SystemExit(3)"])]
    assert executors.run_commands(points, 2, paths.path(tmp_path / "logs")) == ["c"]
    assert (tmp_path / "logs" / "a.log").read_text().strip() == "a saw b"


def test_points_share_a_tokenizer_unless_they_change_a_tokenizer_setting(tmp_path):
    spec = dict(config="configs/tiny.py", grid={"train.learning_rate": [1e-3, 2e-3, 5e-3]},
                points=[{"data.tokenizer.kind": "unigram"}, {"data.tokenizer.kind": "unigram", "seed": 1},
                        {"model.vocab_size": 4096}, {"data.tokenizer.path": "/given/tok"}])
    runs = sweep.plan_runs(spec, str(tmp_path))
    tokenizers = [run["tokenizer"] for run in runs]
    wordpiece = tokenizers[0]
    assert wordpiece.startswith(str(tmp_path / "tokenizers" / "wordpiece-"))
    assert tokenizers[:3] == [wordpiece] * 3  # the learning rate leaves the tokenizer alone
    assert tokenizers[3] == tokenizers[4] and tokenizers[3].startswith(str(tmp_path / "tokenizers" / "unigram-"))
    assert tokenizers[5] not in (wordpiece, tokenizers[3])  # another vocabulary size, another tokenizer
    assert tokenizers[6] is None and runs[6]["overrides"]["data.tokenizer.path"] == "/given/tok"
    assert runs[0]["argv"][-1] == f"--config.data.tokenizer.path={wordpiece}"
    assert len(sweep.shared_tokenizers(runs)) == 3


@pytest.mark.slow  # a tokenizer and three pre-training runs, in subprocesses
def test_three_learning_rates_train_one_tokenizer_and_the_summary_shows_its_hash(tmp_path):
    base = micro_config()
    overrides = {"model.vocab_size": base.model.vocab_size, "model.hidden_size": 32, "model.num_heads": 2,
                 "model.intermediate_size": 64, "data.max_seq_length": 64, "data.max_predictions_per_seq": 10,
                 "data.num_eval_batches": 1, "train.global_batch_size": 8, "train.num_steps": 3,
                 "train.warmup_steps": 1, "train.log_every_steps": 1, "train.eval_every_steps": 3,
                 "checkpoint.every_steps": 3, "logging.peak_flops_per_device": 1e11, "logging.tensorboard": False}
    sweep_file = tmp_path / "two_lr.py"
    sweep_file.write_text(
        "def get_sweep():\n"
        f"    return dict(config='configs/tiny.py', overrides={overrides!r},\n"
        "                grid={'train.learning_rate': [1e-3, 1e-2, 3e-2]})\n"
    )
    sweep_dir = tmp_path / "sweep"
    run = subprocess.run([sys.executable, "-m", "bert_jax.commands.sweep", "run", f"--sweep={sweep_file}",
                          f"--sweep_dir={sweep_dir}"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = subprocess.run([sys.executable, "-m", "bert_jax.commands.sweep", "summary", f"--sweep_dir={sweep_dir}"],
                             cwd=REPO, capture_output=True, text=True)
    assert summary.returncode == 0, summary.stderr[-3000:]
    with open(sweep_dir / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["run"] for r in rows] == ["learning_rate=0.001", "learning_rate=0.01", "learning_rate=0.03"]
    assert all(r["step"] == "3" and float(r["eval/loss"]) > 0 for r in rows)
    assert len({r["train/loss"] for r in rows}) == 3  # the override reached each run
    (trained,) = (sweep_dir / "tokenizers").iterdir()  # one tokenizer, trained once
    assert run.stdout.count("training the shared tokenizer") == 1
    sha256 = tokenizer_lib.tokenizer_hash(str(trained))
    assert {r["tokenizer"] for r in rows} == {sha256[:12]}
    summary_md = (sweep_dir / "summary.md").read_text()
    assert "| learning_rate=0.01 | done | 3 |" in summary_md
    assert f"1 tokenizer(s) (sha256 of tokenizer/):\n- `{sha256}` (wordpiece): learning_rate=0.001, " in summary_md
    assert (sweep_dir / "curves.png").stat().st_size > 1000


def test_summary_names_each_runs_tokenizer_and_says_there_is_one_per_kind(tmp_path):
    used = {"lr=1": ("a" * 64, "wordpiece"), "lr=2": ("a" * 64, "wordpiece"), "kind=unigram": ("b" * 64, "unigram")}
    for name, (sha256, kind) in used.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(
            {"data": {"tokenizer": {"kind": kind}}, "run_identity": {"tokenizer_sha256": sha256}}))
        (tmp_path / name / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 7.0, "eval/loss": 7.0}) + "\n")
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": [{"name": name} for name in used]}))
    table = sweep.summarize(str(tmp_path))
    assert [row["tokenizer"] for row in table] == ["a" * 12, "a" * 12, "b" * 12]
    summary_md = (tmp_path / "summary.md").read_text()
    assert "2 tokenizer(s), one per kind (unigram, wordpiece)" in summary_md
    assert f"- `{'a' * 64}` (wordpiece): lr=1, lr=2\n- `{'b' * 64}` (unigram): kind=unigram" in summary_md


def test_a_finetuning_grid_runs_bert_jax_finetune_and_summarises_median_and_range_over_seeds(tmp_path):
    spec = sweep.load_sweep(os.path.join(REPO, "configs/sweeps/finetune_grid.py"))
    runs = sweep.plan_runs(spec, str(tmp_path))
    assert len(runs) == 12 and all(r["tokenizer"] is None for r in runs)  # the encoder's tokenizer is kept
    assert runs[0]["argv"][1:3] == ["-m", "bert_jax.finetune"]
    assert runs[0]["name"] == "learning_rate=2e-05,epochs=2.0,seed=0"
    keys = spec["summary_keys"]
    record = {"config": spec["config"], "summary_keys": list(keys),
              "runs": [{k: r[k] for k in ("name", "overrides", "point", "tokenizer")} for r in runs[:3]]}
    (tmp_path / "sweep.json").write_text(json.dumps(record))
    for accuracy, run in zip((0.7, 0.8, 0.9), runs[:3]):
        (tmp_path / run["name"]).mkdir()
        (tmp_path / run["name"] / "metrics.jsonl").write_text(
            json.dumps({"step": 8, "train/loss": 0.5, "eval/loss": 0.6, "eval/accuracy": accuracy}) + "\n")
    sweep.summarize(str(tmp_path))
    summary_md = (tmp_path / "summary.md").read_text()
    assert "| learning_rate=2e-05,epochs=2.0 | 3 | 0.5 [0.5–0.5] | 0.6 [0.6–0.6] | 0.8 [0.7–0.9] | — |" in summary_md


def test_summary_gives_final_and_best_values_and_each_runs_state(tmp_path):
    runs = {"lr=1": [(1, 7.0, 0.1), (2, 6.0, 0.3), (3, 6.5, 0.2)], "lr=2": [(1, 7.5, 0.05)], "lr=3": []}
    for name, rows in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "eval/loss": loss, "eval/mlm_accuracy": acc}) + "\n" for s, loss, acc in rows))
    (tmp_path / "lr=1" / "DONE").write_text("{}")
    (tmp_path / "sweep.json").write_text(json.dumps({"summary_keys": ["eval/loss", "eval/mlm_accuracy"],
                                                    "runs": [{"name": name} for name in runs]}))
    sweep.ROW_COLUMNS.append(lambda workdir, run: {"downstream/median": 0.5 if run["name"] == "lr=1" else None})
    try:
        table = sweep.summarize(str(tmp_path))
    finally:
        sweep.ROW_COLUMNS.pop()
    assert [(r["state"], r["step"]) for r in table] == [("done", 3), ("running", 1), ("pending", 0)]
    assert (table[0]["eval/loss"], table[0]["best eval/loss"]) == (6.5, 6.0)  # the lowest loss
    assert (table[0]["eval/mlm_accuracy"], table[0]["best eval/mlm_accuracy"]) == (0.2, 0.3)  # the highest accuracy
    summary_md = (tmp_path / "summary.md").read_text()
    assert "| lr=1 | done | 3 | 6.5 (6) | 0.2 (0.3) | 0.5 | — |" in summary_md
    assert "| lr=3 | pending | 0 | — | — | — | — |" in summary_md
    with open(tmp_path / "summary.csv") as f:
        assert next(csv.reader(f)) == ["run", "state", "step", "eval/loss", "best eval/loss", "eval/mlm_accuracy",
                                       "best eval/mlm_accuracy", "downstream/median", "tokenizer"]
