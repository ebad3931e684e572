"""Loss spikes rolled back (config.train.spike): the last good checkpoint restored, the batches that led there skipped.

PaLM's training (Chowdhery et al. 2022, §5.1) met loss spikes that neither clipping nor a lower rate prevented; what
worked was to restart from a checkpoint about 100 steps before the spike and skip the 200-500 batches around it. Here
a step whose loss is not finite, or exceeds `factor` x the median of the last `window` logged losses, is a spike:
the harness (bert_jax/run/harness.py) waits for the saves under way, restores the newest checkpoint before that step
(its train state and its data iterator's position), and draws and drops the batches of the steps from there to the
spike, so that the data position moves past them; then it trains on from the checkpoint's step. The steps it trained
past the checkpoint are trained again, on the batches after the skipped ones.

Where it is checked: at every logged step and before every save, over each step since the last check (the host
reads their metrics there anyway), so a spike never reaches a checkpoint (a preemption's save with a spike pending
is skipped: the next start resumes before it, meets the spike again and rolls it back). The median is of the logged losses (the
rows' `train/loss`, each a mean over its steps), so a resume rebuilds it exactly from metrics.jsonl's rows up to the
checkpoint it restores: a run resumed after a rollback goes on as the run that never stopped.

What it leaves: metrics.jsonl's rows after the restored step are dropped (as a resume drops them); the next rows
carry `train/rollbacks` and `train/skipped_batches`, counted over the whole run; the console names the step, its
loss, the median and the batches skipped; goodput counts the rolled-back steps' time (run/goodput.py, "rolled
back"). A spike before the first checkpoint, or more than `max_rollbacks` of them, stops the run, naming why.
"""
from __future__ import annotations

import ml_collections
import numpy as np
from absl import logging

# Logged losses the median needs before a step can be judged against it (a non-finite loss is judged always).
MIN_HISTORY = 4
# Logged losses kept besides the window, for a rollback to a checkpoint that many rows back.
KEPT_BEYOND_WINDOW = 1024


def default_config() -> ml_collections.ConfigDict:
    """config.train.spike: off (factor 0)."""
    c = ml_collections.ConfigDict()
    # k: a loss above k x the running median is a spike, and so is a non-finite one; 0 = off (a non-finite loss then
    # stops or skips its step by config.train.nan_policy)
    c.factor = 0.0
    c.window = 32  # logged losses the running median is over
    c.max_rollbacks = 8  # rollbacks in the whole run before it stops instead
    return c


def check_config(spike_cfg) -> None:
    """config.train.spike's keys: a factor of 0 (off) or above 1, a window of 1 or more, max_rollbacks of 0 or more."""
    if spike_cfg.factor != 0 and not spike_cfg.factor > 1:
        raise ValueError(f"config.train.spike.factor={spike_cfg.factor}: 0 (off) or above 1 (a loss above factor x "
                         f"its running median is a spike)")
    if spike_cfg.window < 1 or spike_cfg.max_rollbacks < 0:
        raise ValueError(f"config.train.spike.window={spike_cfg.window} must be >= 1 and max_rollbacks="
                         f"{spike_cfg.max_rollbacks} >= 0")


class SpikeStop(RuntimeError):
    """A spike the run cannot roll back: none of its checkpoints is before it, or too many rollbacks."""


class Spikes:
    """The running median of logged losses, the counts, and the check. `rows`: metrics.jsonl's rows up to the step
    this start resumed from (a fresh run: none); every process reads them, so every process decides alike."""

    def __init__(self, spike_cfg, rows: list[dict]):
        self.factor, self.window, self.max_rollbacks = spike_cfg.factor, spike_cfg.window, spike_cfg.max_rollbacks
        self.history = [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]  # (step, logged loss)
        counted = next((r for r in reversed(rows) if "train/rollbacks" in r), {})
        self.rollbacks = int(counted.get("train/rollbacks", 0))
        self.skipped_batches = int(counted.get("train/skipped_batches", 0))

    def first_spike(self, pending: list[tuple[int, dict]]) -> tuple[int, float, float] | None:
        """(step, loss, median) of the first spike among `pending` ([(step, host metrics)], oldest first), or None."""
        losses = [loss for _, loss in self.history[-self.window:]]
        median = float(np.median(losses)) if len(losses) >= MIN_HISTORY else float("nan")
        for step, metrics in pending:
            loss = float(metrics["loss"])
            if not np.isfinite(loss) or float(metrics.get("nonfinite", 0.0)) > 0:
                return step, loss, median
            if np.isfinite(median) and loss > self.factor * median:
                return step, loss, median
        return None

    def logged(self, step: int, row: dict) -> None:
        """A train row about to be written: its loss joins the window; the run's counts join the row."""
        self.history.append((step, row["train/loss"]))
        del self.history[:-(self.window + KEPT_BEYOND_WINDOW)]
        row["train/rollbacks"] = float(self.rollbacks)
        row["train/skipped_batches"] = float(self.skipped_batches)

    def good_step(self, spike_step: int, saved_steps: list[int]) -> int:
        """The checkpoint to roll back to: the newest before `spike_step`; SpikeStop if none, or too many."""
        before = [s for s in saved_steps if s < spike_step]
        if not before:
            raise SpikeStop(f"a loss spike at step {spike_step} before the run's first checkpoint: there is nothing "
                            f"to roll back to (config.train.spike); lower config.checkpoint.every_steps")
        if self.rollbacks >= self.max_rollbacks:
            raise SpikeStop(f"a loss spike at step {spike_step} after {self.rollbacks} rollbacks "
                            f"(config.train.spike.max_rollbacks={self.max_rollbacks}): the run stops rather than roll "
                            f"back again; the learning rate, or the data, may need a look")
        return max(before)

    def rolled_back(self, spike: tuple[int, float, float], good: int) -> None:
        """Counts the rollback, and forgets the losses logged after `good`: trained again, they are logged again."""
        step, loss, median = spike
        self.rollbacks += 1
        self.skipped_batches += step - good
        self.history = [(s, value) for s, value in self.history if s <= good]
        logging.warning("loss spike at step %d: loss %.4g against a running median of %.4g (config.train.spike."
                        "factor=%g); rolled back to the checkpoint of step %d and skipped the %d batch(es) of steps "
                        "%d to %d (rollback %d of at most %d)", step, loss, median, self.factor, good, step - good,
                        good + 1, step, self.rollbacks, self.max_rollbacks)
