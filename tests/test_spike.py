"""config.train.spike (bert_jax/run/spike.py): one poisoned batch makes a loss spike; the run rolls back to the last
good checkpoint, skips the batches that led to it, trains on, counts the rollback in its rows and its goodput, and
resumes exactly afterwards. The harness runs the micro BERT on seeded batches, one of which is poisoned."""
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


class RowHooks:
    """The harness's hooks at their plainest: a row every step, a checkpoint every 4, no evaluation."""

    def started(self, step, state, writer):
        pass

    def logs_at(self, step):
        return True

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


def spike_config(factor: float = 3.0):
    c = micro_config()
    c.train.num_steps = NUM_STEPS
    c.train.spike.factor = factor
    c.checkpoint.async_save = False
    c.logging.tensorboard = False
    c.logging.plots = False
    return check_config(c)


@pytest.fixture(scope="module")
def program():
    return build_program(spike_config(), make_mesh(spike_config().mesh))


def run(program, workdir, last_step: int, poisoned: int = POISONED, skip=(), factor: float = 3.0):
    config = spike_config(factor)
    batches = harness.Batches(SeededBatches(config.data, config.train.global_batch_size, poisoned, skip))
    harness.run(program, batches, RowHooks(), str(workdir), config, last_step)
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


def test_the_running_median_judges_a_step_and_a_non_finite_loss_always():
    cfg = spike_config().train.spike
    spikes = spike.Spikes(cfg, [{"step": s, "train/loss": 2.0} for s in range(1, 5)])
    assert spikes.first_spike([(5, {"loss": 5.9, "nonfinite": 0.0})]) is None
    assert spikes.first_spike([(5, {"loss": 5.9, "nonfinite": 0.0}), (6, {"loss": 6.1, "nonfinite": 0.0})])[:2] == \
        (6, pytest.approx(6.1))
    fresh = spike.Spikes(cfg, [])  # no history yet: only a non-finite loss is a spike
    assert fresh.first_spike([(1, {"loss": 1e9, "nonfinite": 0.0})]) is None
    assert fresh.first_spike([(1, {"loss": float("nan"), "nonfinite": 1.0})])[0] == 1
    with pytest.raises(spike.SpikeStop, match="before the run's first checkpoint"):
        fresh.good_step(3, [4, 8])
    assert fresh.good_step(11, [4, 8, 12]) == 8


def test_a_factor_of_1_or_below_is_refused_naming_the_key():
    c = micro_config()
    c.train.spike.factor = 0.5
    with pytest.raises(ValueError, match=r"config.train.spike.factor=0.5: 0 \(off\) or above 1"):
        check_config(c)
