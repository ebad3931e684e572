"""End-to-end behaviour of `pretrain`: resume, workdir contents, config errors."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import bert_jax.configs.tiny
from bert_jax.checkpoint.params import restore_params
from bert_jax.families import model_for
from bert_jax.storage.workdir import Workdir
from bert_jax.run import goodput, profile_window
from bert_jax.run.completion import read_done
from bert_jax.run.harness import NonFiniteLossError
from bert_jax.train.loop import train_and_evaluate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def micro_config():
    """configs/tiny.py shrunk to seconds: the same code paths, a smaller model and batch."""
    c = bert_jax.configs.tiny.get_config()
    c.model.vocab_size = 1024
    c.model.hidden_size = 32
    c.model.num_heads = 2
    c.model.intermediate_size = 64
    c.model.scan_layers = True
    c.model.attention_dropout_rate = 0.1  # randomness must resume exactly too
    c.data.max_seq_length = 64
    c.data.max_predictions_per_seq = 10
    c.data.num_eval_batches = 2
    c.train.global_batch_size = 8
    c.train.num_steps = 8
    c.train.warmup_steps = 2
    c.train.log_every_steps = 1
    c.train.eval_every_steps = 4
    c.checkpoint.every_steps = 4
    c.logging.peak_flops_per_device = 1e11  # skip the matmul measurement
    return c


def micro_overrides():
    """micro_config() as command-line overrides of configs/tiny.py, for runs in a subprocess."""

    def flat(d, prefix=""):
        for k, v in d.items():
            yield from flat(v, f"{prefix}{k}.") if isinstance(v, dict) else [(f"{prefix}{k}", v)]

    tiny = dict(flat(bert_jax.configs.tiny.get_config().to_dict()))
    return [f"--config.{k}={v}" for k, v in flat(micro_config().to_dict()) if tiny[k] != v]


def read_metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_losses(workdir):
    return [(r["step"], r["train/loss"]) for r in read_metrics(workdir) if "train/loss" in r]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, xla_compile_cache):
    workdir = str(tmp_path_factory.mktemp("straight"))
    config = micro_config()
    config.train.profile.start_step, config.train.profile.num_steps = PROFILED_STEPS[0], len(PROFILED_STEPS)
    final = train_and_evaluate(config, workdir)
    return workdir, final


PROFILED_STEPS = (2, 3, 4)  # straight_run's profiler window (tests/test_observability.py reads its trace)


def test_workdir_holds_the_contracted_files(straight_run):
    workdir, final = straight_run
    for name in ("config.json", "metrics.jsonl", "checkpoints", "tokenizer/vocab.txt", "plots/loss.png"):
        assert os.path.exists(os.path.join(workdir, name)), name
    rows = read_metrics(workdir)
    train_keys = {"step", "train/loss", "train/mlm_accuracy", "train/learning_rate", "train/grad_norm",
                  "perf/tokens_per_s", "perf/mfu", "perf/step_time_s", "perf/peak_flops", "perf/flops_per_step",
                  "time/data_wait_s", "time/dispatch_s", "time/device_s", "time/checkpoint_s"}
    assert all(train_keys <= set(r) for r in rows if "train/loss" in r)
    assert [r["step"] for r in rows if "eval/loss" in r] == [4, 8]
    assert {"eval/loss", "eval/mlm_accuracy", "eval/nsp_accuracy"} <= set(final)
    assert json.load(open(os.path.join(workdir, "config.json")))["model"]["hidden_size"] == 32
    assert not os.path.exists(os.path.join(workdir, "LEASE"))  # released at the end
    assert read_done(workdir) == {"step": 8, "last_step": 8, "kind": "pretrain",
                                  "finished_at": read_done(workdir)["finished_at"]}


def test_workdir_restores_exactly_the_params_each_checkpoint_saved(straight_run):
    workdir = Workdir(straight_run[0])
    assert workdir.checkpoint_steps() == [4, 8]
    restored = {}
    for step in (4, 8):
        # The whole train state as orbax saved it (optimizer state too), read without a target.
        saved = ocp.PyTreeCheckpointer().restore(str(workdir.checkpoints / str(step) / "state"))["params"]
        restored[step], got_step = restore_params(workdir, model_for, step)
        assert got_step == step
        assert jax.tree.structure(restored[step]) == jax.tree.structure(saved)
        for ours, theirs in zip(jax.tree.leaves(restored[step]), jax.tree.leaves(saved)):
            assert isinstance(ours, np.ndarray)  # on the host, whatever mesh trained it
            np.testing.assert_array_equal(ours, np.asarray(theirs))
    newest, step = restore_params(workdir, model_for)
    assert step == 8
    jax.tree.map(np.testing.assert_array_equal, newest, restored[8])
    assert not np.array_equal(jax.tree.leaves(restored[4])[0], jax.tree.leaves(restored[8])[0])
    with pytest.raises(ValueError, match=r"step 5: .*checkpoints holds steps \[4, 8\]"):
        restore_params(workdir, model_for, 5)


def test_resume_gives_identical_losses(straight_run, tmp_path):
    workdir, _ = straight_run
    resumed = str(tmp_path / "resumed")  # trains its own tokenizer: the same one (deterministic)
    train_and_evaluate(micro_config(), resumed, stop_at_step=4)
    assert [s for s, _ in train_losses(resumed)] == [1, 2, 3, 4]
    assert read_done(resumed) is None  # stopped, not finished: a launcher relaunches it
    train_and_evaluate(micro_config(), resumed)  # a new process would do the same: restore step 4
    straight, again = train_losses(workdir), train_losses(resumed)
    assert [s for s, _ in again] == list(range(1, 9))
    for (s1, a), (s2, b) in zip(straight, again):
        assert s1 == s2 and a == b, (s1, a, b)  # the same compiled step on the same state and batch: bit for bit
    assert read_done(resumed)["step"] == 8
    stopped_and_resumed = goodput.account(goodput.read(resumed))  # a stop saves: nothing is trained twice
    assert (stopped_and_resumed.starts, stopped_and_resumed.replayed_steps) == (2, 0)


def test_each_logged_step_splits_its_time_and_the_split_is_plotted(straight_run):
    workdir, _ = straight_run
    rows = [r for r in read_metrics(workdir) if "train/loss" in r]
    assert rows[0]["time/compile_s"] > 0 and all("time/compile_s" not in r for r in rows[1:])
    for r in rows[1:]:
        parts = sum(r[f"time/{name}_s"] for name in ("data_wait", "dispatch", "device", "checkpoint"))
        assert 0 < parts <= 1.05 * r["perf/step_time_s"] + 1e-3, r
    assert sum(r["time/checkpoint_s"] for r in rows) > 0  # the save at step 4 shows in step 5's row
    assert os.path.getsize(os.path.join(workdir, "plots", "step_time.png")) > 1000


def test_every_rows_mfu_is_its_flops_per_step_over_its_step_time_over_one_peak(straight_run):
    """MFU x peak x step time = FLOPs per step on every row, against the one peak of the run (issue 76)."""
    rows = [r for r in read_metrics(straight_run[0]) if "perf/mfu" in r]
    assert len(rows) == 8
    assert {r["perf/peak_flops"] for r in rows} == {1e11 * jax.device_count()}
    assert len({r["perf/flops_per_step"] for r in rows}) == 1 and rows[0]["perf/flops_per_step"] > 0
    for r in rows:
        assert r["perf/mfu"] == pytest.approx(r["perf/flops_per_step"] / r["perf/step_time_s"] / r["perf/peak_flops"],
                                              rel=1e-12)


def test_goodput_of_a_run_accounts_for_its_whole_wall_time(straight_run):
    workdir, _ = straight_run
    result = goodput.account(goodput.read(workdir))
    assert (result.starts, result.replayed_steps, result.first_step, result.last_step) == (1, 0, 0, 8)
    assert all(result.seconds[k] > 0 for k in ("productive", "startup", "compile", "checkpoint", "evaluation"))
    assert abs(sum(result.seconds.values()) - result.wall_s) <= 0.01 * result.wall_s
    assert re.fullmatch(r"goodput \d+\.\d %", goodput.report(workdir)[-1])


def profiled_steps(workdir) -> list[int]:
    """The step numbers of the StepTraceAnnotations in the run's one trace, read with JAX's own XSpace reader."""
    (trace,) = pathlib.Path(workdir, "profile").rglob("*.xplane.pb")
    data = jax.profiler.ProfileData.from_file(str(trace))
    return sorted(dict(event.stats)["step_num"] for plane in data.planes for line in plane.lines
                  for event in line.events if event.name == profile_window.STEP_NAME)


def test_the_profiler_window_traces_exactly_its_steps(straight_run):
    assert profiled_steps(straight_run[0]) == list(PROFILED_STEPS)


@pytest.mark.slow  # xprof's converter, on the trace straight_run wrote
def test_xprof_opens_the_trace_and_finds_the_train_steps(straight_run):
    raw_to_tool_data = pytest.importorskip("xprof.convert.raw_to_tool_data")
    (trace,) = pathlib.Path(straight_run[0], "profile").rglob("*.xplane.pb")
    data, _ = raw_to_tool_data.xspace_to_tool_data([str(trace)], "trace_viewer", {})
    events = json.loads(data)["traceEvents"]
    steps = sorted({int(e["args"]["step_num"]) for e in events if e.get("args", {}).get("step_num") is not None})
    assert steps == list(PROFILED_STEPS)
    assert any("train_step" in e.get("name", "") for e in events)  # the jitted step's ops, under its name


@pytest.mark.slow
def test_resume_with_grain_worker_processes_gives_identical_losses(tmp_path, xla_compile_cache):
    """data.worker_count=2: the batches cross processes packed, and the checkpointed iterator state
    (the workers' own) resumes the same batches, so the losses match a straight run bit for bit."""
    config = micro_config()
    config.data.worker_count = 2
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    train_and_evaluate(config, straight)
    train_and_evaluate(config, resumed, stop_at_step=4)
    train_and_evaluate(config, resumed)
    assert train_losses(resumed) == train_losses(straight)
    assert [s for s, _ in train_losses(straight)] == list(range(1, 9))


def test_incompatible_checkpoint_fails_with_a_message(straight_run):
    workdir, _ = straight_run
    c = micro_config()
    c.model.intermediate_size = 128
    c.train.num_steps = 12
    c.accept_changes = "model.intermediate_size,train.num_steps"  # past the experiment check, to the checkpoint's
    with pytest.raises(ValueError, match="does not fit this config.*intermediate"):
        train_and_evaluate(c, workdir)


def run_pretrain(*args):
    return subprocess.run(
        [sys.executable, "-m", "bert_jax.commands.pretrain", "--config=configs/tiny.py", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize(
    "override, culprit",
    [
        ("--config.train.learnin_rate=1e-3", "learnin_rate"),
        ("--config.train.num_steps=many", "num_steps"),
        ("--config.model.family=gpt", "known families: albert, bert"),
        ("--config.model.num_heads=3", "num_heads=3 does not divide"),
        ("--config.data.example_builder=full_sentences", "'next_sentence_label', which config.data.example_builder"),
    ],
)
@pytest.mark.slow  # subprocesses; tests/test_bad_input.py's matrix covers these in one
def test_bad_override_fails_before_compiling_naming_the_key(tmp_path, override, culprit):
    result = run_pretrain(f"--workdir={tmp_path / 'w'}", override)
    assert result.returncode != 0
    assert culprit in result.stderr
    assert not os.path.exists(tmp_path / "w" / "checkpoints")


def test_diverging_run_stops_naming_the_step_and_never_checkpoints_nan(straight_run, tmp_path):
    workdir = str(tmp_path / "diverge")
    shutil.copytree(os.path.join(straight_run[0], "tokenizer"), os.path.join(workdir, "tokenizer"))
    c = micro_config()
    c.train.learning_rate, c.train.warmup_steps, c.train.max_grad_norm = 1e30, 0, 0.0
    c.checkpoint.every_steps = 1
    with pytest.raises(NonFiniteLossError, match=r"at step (\d+)") as error:
        train_and_evaluate(c, workdir)
    bad_step = int(re.search(r"at step (\d+)", str(error.value)).group(1))
    saved = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert saved and max(saved) < bad_step


def test_skip_policy_skips_nonfinite_steps_and_checkpoints_only_finite_params(straight_run, tmp_path):
    workdir = str(tmp_path / "skip")
    shutil.copytree(os.path.join(straight_run[0], "tokenizer"), os.path.join(workdir, "tokenizer"))
    c = micro_config()
    c.train.learning_rate, c.train.warmup_steps, c.train.max_grad_norm = 1e30, 0, 0.0
    c.train.nan_policy = "skip"
    c.checkpoint.every_steps = 2
    train_and_evaluate(c, workdir)  # runs to the end instead of stopping
    rows = [r for r in read_metrics(workdir) if "train/loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert sum(r["train/skipped_steps"] for r in rows) > 0
    saved = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert saved[-1] == 8
    for step in saved:  # no checkpoint holds a NaN or an Inf
        params, _ = restore_params(Workdir(workdir), model_for, step)
        assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(params)), step
