"""config.train.spike (bert_jax/run/spike.py): one poisoned batch makes a loss spike; the run rolls back to the last
good checkpoint, skips the batches that led to it, trains on, counts the rollback in its rows and its goodput, and
resumes exactly afterwards. The harness runs the micro BERT on seeded batches, one of which is poisoned: with an
infinite loss, or with a finite one a few times the step losses before it."""
import json

import numpy as np
import pytest

from bert_jax.parallel.mesh import make_mesh
from bert_jax.run import goodput, harness, spike
from bert_jax.run.metrics_file import read_rows
from bert_jax.storage.workdir import Workdir
from bert_jax.train.config_validation import check_config
from bert_jax.train.program import build_program
from data_pipelines.loader import pipeline
from test_pretrain import micro_config

POISONED = 10  # the batch of step 11 (batches count from 0)
NUM_STEPS = 16


class SeededBatches:
    """Batch i is drawn from seed i (the batch_spec layout); batch `poisoned` has its masked weights made infinite,
    so its loss is not finite. `skip`: indices never drawn (a reference run's). Checkpointable like grain's."""

    def __init__(self, data_cfg, batch_size: int, poisoned: int = -1, skip=()):
        self.spec = pipeline.batch_spec(data_cfg, batch_size)
        self.vocab, self.length = data_cfg.vocab_size, data_cfg.max_seq_length
        self.poisoned, self.skip, self.index = poisoned, set(skip), 0

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        while self.index in self.skip:
            self.index += 1
        rng = np.random.default_rng(self.index)
        batch = {}
        for key, (shape, dtype) in self.spec.items():
            high = self.length if key == "masked_positions" else self.vocab
            batch[key] = rng.integers(5, high, shape).astype(dtype)
        batch["attention_mask"] = np.ones_like(batch["attention_mask"])
        batch["token_type_ids"] = np.zeros_like(batch["token_type_ids"])
        batch["masked_weights"] = np.ones_like(batch["masked_weights"])
        batch.update({k: (rng.integers(0, 2, self.spec[k][0]).astype(np.int32)) for k in batch if "label" in k})
        if self.index == self.poisoned:
            batch["masked_weights"] = np.full_like(batch["masked_weights"], np.inf)
        self.index += 1
        return batch

    def get_state(self) -> dict:
        return {"index": self.index}

    def set_state(self, state: bytes) -> None:  # grain's checkpoint handler gives a non-grain iterator bytes
        self.index = json.loads(state)["index"]

    def start_prefetch(self) -> None:  # and then asks it to prefetch: nothing to do here
        pass


class OneTargetBatches(SeededBatches):
    """SeededBatches whose masked positions all hold TARGET, which a high learning rate learns in a few steps, but
    for batch `poisoned`, whose all hold another token: a finite loss a few times the step losses before it."""

    TARGET = 7

    def __next__(self) -> dict:
        poisoned, self.poisoned = self.index == self.poisoned, -1 if self.index == self.poisoned else self.poisoned
        batch = super().__next__()
        batch["masked_ids"] = np.full_like(batch["masked_ids"], self.TARGET + 1 if poisoned else self.TARGET)
        return batch


class RowHooks:
    """The harness's hooks at their plainest: a row every `log_every` steps, a checkpoint every 4, no evaluation."""

    def __init__(self, log_every: int = 1):
        self.log_every = log_every

    def started(self, step, state, writer):
        pass

    def logs_at(self, step):
        return step % self.log_every == 0

    def logged(self, step, row):
        pass

    def evaluates_at(self, step):
        return False

    def evaluate(self, step, state, writer):
        return False

    def saves_at(self, step):
        return step % 4 == 0

    def saved(self, step, writer):
        pass

    def closing(self, writer):
        pass

    def data_ended(self, step):
        return {}


def spike_config(factor: float = 3.0, window: int = 32, learning_rate: float | None = None):
    c = micro_config()
    c.train.num_steps = NUM_STEPS
    c.train.spike.factor = factor
    c.train.spike.window = window
    if learning_rate is not None:
        c.train.learning_rate = learning_rate
    c.checkpoint.async_save = False
    c.logging.tensorboard = False
    c.logging.plots = False
    return check_config(c)


@pytest.fixture(scope="module")
def program():
    return build_program(spike_config(), make_mesh(spike_config().mesh))


def run(program, workdir, last_step: int, poisoned: int = POISONED, skip=(), factor: float = 3.0, config=None,
        kind=SeededBatches, log_every: int = 1):
    config = spike_config(factor) if config is None else config
    batches = harness.Batches(kind(config.data, config.train.global_batch_size, poisoned, skip))
    harness.run(program, batches, RowHooks(log_every), str(workdir), config, last_step)
    return [r for r in read_rows(Workdir(str(workdir)).metrics_jsonl) if "train/loss" in r]


@pytest.mark.slow  # four micro runs of 16 steps: a minute on 2 loaded cores
def test_a_poisoned_batch_rolls_back_skips_its_batches_trains_on_and_resumes_exactly(program, tmp_path,
                                                                                    xla_compile_cache):
    rows = run(program, tmp_path / "spiked", NUM_STEPS)
    # One row per step, none from the rolled-back pass; every loss finite.
    assert [r["step"] for r in rows] == list(range(1, NUM_STEPS + 1))
    assert all(np.isfinite(r["train/loss"]) for r in rows)
    # Rolled back to step 8's checkpoint at the spike at step 11, skipping the batches of steps 9 to 11.
    assert [r["train/rollbacks"] for r in rows] == [0.0] * 8 + [1.0] * 8
    assert rows[-1]["train/skipped_batches"] == 3.0

    # The skip: a run that never drew batches 8, 9, 10 trains exactly the same steps.
    reference = run(program, tmp_path / "reference", NUM_STEPS, poisoned=-1, skip=(8, 9, 10), factor=0.0)
    assert [r["train/loss"] for r in reference] == [r["train/loss"] for r in rows]

    # Exactly resumable afterwards: stopped at step 12 (after the rollback), resumed to the end.
    run(program, tmp_path / "resumed", 12)
    resumed = run(program, tmp_path / "resumed", NUM_STEPS)
    assert [(r["step"], r["train/loss"], r["train/rollbacks"]) for r in resumed] == \
        [(r["step"], r["train/loss"], r["train/rollbacks"]) for r in rows]

    # Goodput counts the rollback and the step time it cost.
    record = goodput.read(str(tmp_path / "spiked"))[-1]
    assert record.rollbacks == 1 and record.rolled_back_seconds > 0
    lines = goodput.report(str(tmp_path / "spiked"))
    assert any(line.strip().startswith("rolled back (1)") for line in lines)
    json.dumps(lines)


@pytest.mark.slow  # two micro runs of 16 steps and their compile: a minute on 2 loaded cores
def test_a_finite_spike_between_rows_rolls_back_and_trains_on_as_a_run_that_skipped_its_batches(tmp_path, caplog,
                                                                                               xla_compile_cache):
    """A row every 4 steps; batch 10's targets are a token the run has learnt never to predict: step 11's loss is
    finite and a few times the step losses before it. Judged against those (a median of the rows' means would need 4
    rows, step 16), it rolls the run back to step 8 and skips batches 8-10."""
    config = spike_config(factor=2.0, window=4, learning_rate=3e-2)  # the target learnt in a few steps
    program = build_program(config, make_mesh(config.mesh))
    with caplog.at_level("WARNING"):
        rows = run(program, tmp_path / "spiked", NUM_STEPS, config=config, kind=OneTargetBatches, log_every=4)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loss spike")]
    assert line.startswith("loss spike at step 11: loss ") and "rolled back to the checkpoint of step 8" in line
    assert [r["step"] for r in rows] == [4, 8, 12, 16]
    assert [r["train/rollbacks"] for r in rows] == [0.0, 0.0, 1.0, 1.0]
    assert rows[-1]["train/skipped_batches"] == 3.0

    config.train.spike.factor = 0.0
    reference = run(program, tmp_path / "reference", NUM_STEPS, poisoned=-1, skip=(8, 9, 10), config=config,
                    kind=OneTargetBatches, log_every=4)
    assert [r["train/loss"] for r in reference] == [r["train/loss"] for r in rows]


def spikes(tmp_path, losses=(), window: int = 32) -> spike.Spikes:
    """A fresh run's detector (in `tmp_path`) that has judged steps 1.. with `losses`, none a spike."""
    found = spike.Spikes(spike_config(window=window).train.spike, [], str(tmp_path))
    assert found.first_spike(steps(1, losses)) is None
    return found


def steps(first: int, losses) -> list:
    return [(first + i, {"loss": loss, "nonfinite": 0.0}) for i, loss in enumerate(losses)]


def test_the_running_median_judges_a_step_and_a_non_finite_loss_always(tmp_path):
    assert spikes(tmp_path, [2.0] * 4).first_spike(steps(5, [5.9])) is None
    assert spikes(tmp_path, [2.0] * 4).first_spike(steps(5, [5.9, 6.1])) == (6, pytest.approx(6.1), 2.0)
    fresh = spikes(tmp_path)  # no history yet: only a non-finite loss is a spike
    assert fresh.first_spike(steps(1, [1e9])) is None
    assert spikes(tmp_path).first_spike([(1, {"loss": float("nan"), "nonfinite": 1.0})])[0] == 1
    with pytest.raises(spike.SpikeStop, match="before the run's first checkpoint"):
        fresh.good_step(3, [4, 8])
    assert fresh.good_step(11, [4, 8, 12]) == 8


def test_each_step_loss_is_judged_against_the_step_losses_before_it_not_against_logged_means(tmp_path):
    """Like with like: with a row every 10 steps, step 11 is judged against steps 7-10's own losses (window 4), the
    check before a save and the one at the row judging each step once; no row's mean enters the window."""
    detector = spikes(tmp_path, [], window=4)
    pending = steps(1, [8.0, 6.0, 4.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.2])
    assert detector.first_spike(pending[:8]) is None  # a save's check at step 8
    assert detector.first_spike(pending) is None  # the row's at step 10, over the same pending steps
    assert detector.losses == [1.0, 1.0, 1.0, 1.2] and detector.judged == 10
    detector.logged(10, {"train/loss": 2.62})  # the row's mean joins nothing
    # 3.3 > 3 x 1.0. Against rows' means (2.62 here) it would be no spike, and none would be judged before 4 rows.
    assert detector.first_spike(steps(11, [3.3])) == (11, 3.3, 1.0)


def test_the_window_saved_with_a_checkpoint_is_the_one_a_rollback_and_a_resume_start_from(tmp_path):
    detector = spikes(tmp_path, [2.0, 2.0, 2.0, 2.0], window=4)
    detector.saved(4, kept_steps=[])
    assert detector.first_spike(steps(5, [1.0, 1.0, 1.0, 1.0])) is None
    detector.saved(8, kept_steps=[4])
    assert detector.first_spike(steps(9, [1.0, 9.0])) == (10, 9.0, 1.0)
    detector.rolled_back((10, 9.0, 1.0), detector.good_step(10, [4, 8]))
    assert (detector.losses, detector.judged) == ([1.0] * 4, 8)
    rows = [{"step": 8, "train/loss": 1.0, "train/rollbacks": 0.0, "train/skipped_batches": 0.0}]
    resumed = spike.Spikes(spike_config(window=4).train.spike, rows, str(tmp_path), start=4)
    assert (resumed.losses, resumed.judged) == ([2.0] * 4, 4)
    detector.saved(12, kept_steps=[8])  # step 4's checkpoint gone: its window goes too
    assert sorted(spike.Spikes(spike_config().train.spike, rows, str(tmp_path), start=8).windows) == [8, 12]


def test_a_factor_of_1_or_below_is_refused_naming_the_key():
    c = micro_config()
    c.train.spike.factor = 0.5
    with pytest.raises(ValueError, match=r"config.train.spike.factor=0.5: 0 \(off\) or above 1"):
        check_config(c)
