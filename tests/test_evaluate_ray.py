"""(slow) `bert-jax evaluate --executor=ray` on a local Ray cluster of two fake one-host v4-8 slices: each run of
the battery a `ray-tpu` job, the task that starts from another's run after it, the scoreboard the medians of
the runs, and a rerun that submits nothing (every run DONE)."""
import json
import subprocess
import sys

import pytest

import finetune_data as fd
from test_evaluate import check_board, write_glue
from test_parallel_mesh import FAST_COMPILE
from test_pretrain import REPO
from test_sweep_ray import TPU, two_slice_cluster

pytest.importorskip("torch")
pytest.importorskip("transformers")

# The micro recipe of test_evaluate.micro_suite, as a suite file (the command reads its suite from a file); STS-B
# starts from SST-2's run of the same seed (SST-2 plays MNLI).
SUITE = '''from bert_jax.configs.suites.recipe import suite, task


def get_config():
    c = suite("ray_micro", seeds=2, start_from_mnli=True)
    recipe = dict(learning_rates=(3e-3,), epochs=4.0, batch_size=32, max_seq_length=16)
    c.tasks.sst2 = task("classification", "SST-2", "sentence", "label", "accuracy", labels="0,1", **recipe)
    c.tasks.stsb = task("regression", "STS-B", "sentence1,sentence2", "score", "spearman", init_from_task="sst2",
                        **recipe)
    for t in c.tasks.values():
        t.finetune.model.dropout_rate = 0.0
        t.finetune.train.evals_per_run, t.finetune.train.log_every_steps = 1, 4
        t.finetune.checkpoint.async_save, t.finetune.checkpoint.max_to_keep = False, 1
    return c
'''


@pytest.mark.slow  # a Ray cluster of three nodes and four micro fine-tunings in two waves of two: ~4 min on 2 cores
def test_a_battery_runs_as_ray_jobs_wave_by_wave_and_a_rerun_submits_nothing(tmp_path, tmp_path_factory):
    hf_dir = fd.write_tiny_hf_bert(str(tmp_path / "tiny_hf"))
    glue = write_glue(tmp_path / "glue")
    suite = tmp_path / "suite.py"
    suite.write_text(SUITE)
    out = tmp_path / "out"
    evaluate = [sys.executable, "-m", "bert_jax.commands.evaluate", f"--checkpoint={hf_dir}", f"--suite={suite}",
                f"--glue_dir={glue}", f"--out={out}", "--executor=ray", f"--tpu={TPU}", f"--python={sys.executable}",
                "--max_wait=600"]
    cluster, env = two_slice_cluster(tmp_path, tmp_path_factory)
    try:
        first = subprocess.run([*evaluate, f"--address={cluster.address}"], cwd=REPO, capture_output=True, text=True,
                               env=env, timeout=1200)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    finally:
        cluster.close()
    board = json.loads((out / "scoreboard.json").read_text())
    check_board(board, out, {"sst2": "accuracy", "stsb": "spearman"}, 2)
    for seed in (0, 1):  # each STS-B run started from SST-2's run of its seed, which had finished
        config = json.loads((out / "runs" / "stsb" / "lr=0.003" / f"seed={seed}" / "config.json").read_text())
        assert config["init_from"] == str(out / "runs" / "sst2" / "lr=0.003" / f"seed={seed}")
    logs = {p.name: p.read_text() for p in (out / "logs").iterdir()}
    assert sorted(logs) == [f"{t},lr=0.003,seed={s}.log" for t in ("sst2", "stsb") for s in (0, 1)]
    assert {s for log in logs.values() for s in ("slice-a", "slice-b") if s in log} == {"slice-a", "slice-b"}
    # Everything DONE: the same command (the cluster gone) submits nothing and writes the same board.
    again = subprocess.run([*evaluate, "--address=127.0.0.1:1"], cwd=REPO, capture_output=True, text=True, env=env,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "ray_tpu" not in again.stdout and json.loads((out / "scoreboard.json").read_text()) == board
