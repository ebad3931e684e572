"""Counters past 2^31 (issue 69, bert_jax/train/counters.py): a run whose state says step 2^31 - 16 resumes and trains
32 steps across the boundary; its WSD schedule (its decay included), data position, RNG folds, metrics rows,
checkpoint names, goodput and tokens seen are each right, and a stop and resume past 2^31 repeats it bit for bit."""
import json
import pathlib
import re
import shutil
import warnings

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from grain import checkpoint as grain_checkpoint

from bert_jax.checkpoint import manager as ckpt
from bert_jax.parallel.mesh import make_mesh
from bert_jax.run import goodput
from bert_jax.run.metrics_file import read_rows, truncate_metrics
from bert_jax.storage.workdir import Workdir
import bert_jax.configs.tiny
from bert_jax.train import counters
from bert_jax.train import stages as stages_lib
from bert_jax.train.config_validation import check_config
from bert_jax.train.loop import train
from bert_jax.train.optimizer import learning_rate_schedule
from bert_jax.train.program import build_program
from test_pretrain import micro_config

START = 2**31 - 16
END = START + 32
DECAY = 24  # the WSD decay's steps, the last of num_steps = 2^31 + 24: from count 2^31 on, inside the 32


def counter_config():
    c = micro_config()
    c.train.num_steps = 2**31 + DECAY
    c.train.schedule = "wsd"
    c.train.decay_fraction = DECAY / c.train.num_steps
    c.train.end_learning_rate = 0.0
    c.train.eval_every_steps = 16
    c.checkpoint.every_steps = 16
    c.checkpoint.async_save = False
    return c


def wsd_reference(train_cfg, count: int) -> float:
    """The WSD learning rate at optax count `count`, in float64 Python arithmetic."""
    peak, total, warmup = train_cfg.learning_rate, train_cfg.num_steps, train_cfg.warmup_steps
    decay_steps = max(int(round(train_cfg.decay_fraction * total)), 1)
    stable_until = max(total - decay_steps, warmup)
    if count < warmup:
        return peak * count / warmup
    if count < stable_until:
        return peak
    return peak * (1.0 - min((count - stable_until) / decay_steps, 1.0) ** 0.5)


def move_to(workdir, config, step_from: int, step_to: int) -> None:
    """The checkpoint of `step_from` rewritten as the state of `step_to`: its step and the optimizer's counts set
    (as a run that trained that far would hold them), the data iterator's position kept; its metrics rows dropped."""
    program = build_program(config, make_mesh(config.mesh))
    manager = ckpt.make_manager(str(Workdir(workdir).checkpoints), config.checkpoint)
    with jax.set_mesh(program.mesh):
        state = manager.restore(step_from, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(program.abstract_state)))["state"]
    data = (Workdir(workdir).checkpoints / str(step_from) / ckpt.DATA_ITEM)
    iterator_state = next(p for p in data.iterdir() if p.name.endswith(".json")).read_bytes()

    def to_step(path, leaf):
        name = str(getattr(path[-1], "name", getattr(path[-1], "key", "")))
        return np.asarray(step_to, leaf.dtype) if name in ("step", "count") and leaf.ndim == 0 else leaf

    state = jax.tree_util.tree_map_with_path(to_step, state)

    class Snapshot:
        def get_state(self):
            return iterator_state

    manager.save(step_to, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                  data=grain_checkpoint.CheckpointSave(Snapshot())))
    manager.wait_until_finished()
    manager.close()
    shutil.rmtree(Workdir(workdir).checkpoints / str(step_from))
    truncate_metrics(Workdir(workdir).metrics_jsonl, 0)


@pytest.fixture(scope="module")
def resumed_past_2_31(tmp_path_factory, xla_compile_cache):
    """(config, workdir): 16 steps trained, moved to step 2^31 - 16, then 32 steps trained past 2^31."""
    workdir = str(tmp_path_factory.mktemp("counters") / "run")
    config = check_config(counter_config(), workdir)
    train(config, workdir, stop_at_step=16)
    move_to(workdir, config, 16, START)
    shutil.copytree(workdir, workdir + "_at_start")
    train(config, workdir, stop_at_step=END)
    return config, workdir


@pytest.mark.slow  # three micro runs and a resume: minutes on 2 loaded cores
def test_the_state_steps_and_schedule_count_go_past_2_31(resumed_past_2_31):
    config, workdir = resumed_past_2_31
    program = build_program(config, make_mesh(config.mesh))
    manager = ckpt.make_manager(str(Workdir(workdir).checkpoints), config.checkpoint)
    # Checkpoint names past 2^31, at the cadence of 16.
    assert sorted(manager.all_steps()) == [START, START + 16, END]
    with jax.set_mesh(program.mesh):
        state = manager.restore(END, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(program.abstract_state)))["state"]
    manager.close()
    assert state.step.dtype == np.uint32 and int(state.step) == END
    counts = {str(leaf.dtype): int(leaf) for leaf in jax.tree.leaves(state.opt_state) if leaf.ndim == 0}
    # The schedule's count goes past 2^31; Adam's (int32, its bias correction 1.0 long before) stops at 2^31 - 1.
    assert counts == {"uint32": END, "int32": 2**31 - 1}


@pytest.mark.slow  # three micro runs and a resume: minutes on 2 loaded cores
def test_metrics_rows_learning_rate_and_tokens_past_2_31(resumed_past_2_31):
    config, workdir = resumed_past_2_31
    train_rows = [r for r in read_rows(Workdir(workdir).metrics_jsonl) if "train/loss" in r]
    assert [r["step"] for r in train_rows] == list(range(START + 1, END + 1))  # one row per step, none twice
    for row in train_rows:
        want = wsd_reference(config.train, row["step"] - 1)
        assert row["train/learning_rate"] == pytest.approx(want, rel=1e-5, abs=1e-9), row["step"]
        assert np.isfinite(row["train/loss"])
        assert row["train/tokens_seen"] == row["step"] * 8 * 64
        # MFU against one peak measured at start-up, never raised to an interval's rate: a row may log above 1
        # (bert_jax/train/perf.py), and it is always the ratio of what the row carries.
        assert row["perf/mfu"] > 0 and row["perf/mfu"] == pytest.approx(
            row["perf/flops_per_step"] / row["perf/step_time_s"] / row["perf/peak_flops"], rel=1e-12)
    assert len({r["perf/peak_flops"] for r in train_rows}) == 1  # one start: one peak, measured once
    decaying = [r["train/learning_rate"] for r in train_rows if r["step"] > 2**31 + 1]
    assert decaying[0] < config.train.learning_rate and all(np.diff(decaying) < 0)  # the decay runs, down
    evals = [r["step"] for r in read_rows(Workdir(workdir).metrics_jsonl) if "eval/loss" in r]
    assert evals == [START + 16, END]


def test_tokens_seen_follow_the_stages_of_a_staged_run():
    config = bert_jax.configs.tiny.get_config("two_stage")  # 240 steps at seq 64, then 60 at seq 128, batch 32
    spans = counters.token_spans(stages_lib.plan(config), config)
    assert spans == [(0, 240, 32 * 64), (240, 300, 32 * 128)]
    assert counters.tokens_seen(250, spans) == 240 * 32 * 64 + 10 * 32 * 128


def test_tokens_seen_are_exact_at_10_13():
    per_step = 4657  # 2^31 steps of it: 10^13 tokens
    step = 2**31 + 5
    seen = counters.tokens_seen(step, [(0, 2**40, per_step)])
    assert seen == step * per_step > 10**13
    assert json.loads(json.dumps({"train/tokens_seen": float(seen)}))["train/tokens_seen"] == seen  # as a row holds it
    staged = counters.tokens_seen(3 * 10**9, [(0, 10**9, 1000), (10**9, 2**40, 4000)])
    assert staged == 10**9 * 1000 + 2 * 10**9 * 4000 == 9 * 10**12
    assert float(staged) == staged


@pytest.mark.slow  # three micro runs and a resume: minutes on 2 loaded cores
def test_goodput_counts_the_steps_past_2_31(resumed_past_2_31):
    config, workdir = resumed_past_2_31
    lines = goodput.report(workdir)
    assert f"steps 0 -> {END}" in lines[0]
    result = goodput.account(goodput.read(workdir))
    assert result.replayed_steps == 0 and all(v >= 0 for v in result.seconds.values())


@pytest.mark.slow  # three micro runs and a resume: minutes on 2 loaded cores
def test_a_stop_and_resume_past_2_31_repeats_the_run(resumed_past_2_31, tmp_path):
    """The RNG folds (dropout is on) and the data position, across a stop at step 2^31."""
    config, workdir = resumed_past_2_31
    again = str(tmp_path / "run")
    shutil.copytree(workdir + "_at_start", again)
    train(config, again, stop_at_step=2**31)
    train(config, again, stop_at_step=END)
    losses = lambda d: [(r["step"], r["train/loss"]) for r in read_rows(Workdir(d).metrics_jsonl) if "train/loss" in r]  # noqa: E731
    assert losses(again) == losses(workdir)
    assert json.loads((Workdir(again).checkpoints / str(END) / ckpt.DATA_ITEM).iterdir().__next__().read_text()) \
        == json.loads((Workdir(workdir).checkpoints / str(END) / ckpt.DATA_ITEM).iterdir().__next__().read_text())



@pytest.mark.parametrize("schedule", ["linear", "wsd", "cosine", "constant", "onecycle"])
def test_schedules_are_built_in_python_integers_without_a_uint32_wrap(schedule):
    """configs/tiny.py with num_steps=30 (below its warmup, a case the warmup check then refuses in one line) built
    its linear schedule from uint32 counts, num_steps - warmup_steps wrapping with numpy's "overflow encountered in
    scalar subtract" before that line."""
    config = bert_jax.configs.tiny.get_config()
    config.train.num_steps, config.train.schedule = 30, schedule
    if schedule == "onecycle":
        config.train.warmup_steps = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning fails the test
        lr = learning_rate_schedule(config.train)
        assert np.isfinite(counters.schedule_at(lr, 29))
    assert counters.count(2**32 - 1) == np.uint32(2**32 - 1)
    with pytest.raises(ValueError, match="outside"):
        counters.count(-1)


def test_tokens_per_step_are_taken_in_one_place():
    """A step's tokens (global batch x max_seq_length) were computed in counters, the model card, the budget and the
    budget's plan, each its own way; now counters.tokens_per_step alone takes the product."""
    root = pathlib.Path(__file__).resolve().parents[1]
    product = re.compile(r"global_batch_size\s*\*[^\n]*max_seq_length|max_seq_length\s*\*[^\n]*global_batch_size")
    found = [f"{path.relative_to(root)}:{number}" for folder in ("bert_jax", "launch", "data_pipelines")
             for path in sorted((root / folder).rglob("*.py")) if path.name != "counters.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if product.search(line)]
    assert found == []
    config = bert_jax.configs.tiny.get_config("two_stage")
    assert [counters.tokens_per_step(s.config) for s in stages_lib.plan(config)] == [32 * 64, 32 * 128]
