"""Loss spikes rolled back (config.train.spike): the last good checkpoint restored, the batches that led there skipped.

PaLM's training (Chowdhery et al. 2022, §5.1) met loss spikes that neither clipping nor a lower rate prevented; what
worked was to restart from a checkpoint about 100 steps before the spike and skip the 200-500 batches around it. Here
a step whose loss is not finite, or exceeds `factor` x the median of the `window` step losses before it, is a spike:
the harness (bert_jax/run/harness.py) waits for the saves under way, restores the newest checkpoint before that step
(its train state and its data iterator's position), and draws and drops the batches of the steps from there to the
spike, so that the data position moves past them; then it trains on from the checkpoint's step. The steps it trained
past the checkpoint are trained again, on the batches after the skipped ones.

Where it is checked: at every logged step and before every save, over each step since the last check (the host
reads their metrics there anyway), so a spike never reaches a checkpoint (a preemption's save with a spike pending
is skipped: the next start resumes before it, meets the spike again and rolls it back). Like is compared with like:
each step's loss against the median of the `window` step losses before it, whatever config.train.log_every_steps
is (a logged loss is a mean over its steps, smoother than any one of them, and a row every 100 steps would need
400 steps before 4 of them made a median). The window is saved beside each checkpoint (DIR/spike_windows.json,
written before the checkpoint's save), so a rollback, and a resume, start from the window the checkpoint's step
had: a run resumed after a rollback goes on as the run that never stopped.

What it leaves: metrics.jsonl's rows after the restored step are dropped (as a resume drops them); the next rows
carry `train/rollbacks` and `train/skipped_batches`, counted over the whole run; the console names the step, its
loss, the median and the batches skipped; goodput counts the rolled-back steps' time (run/goodput.py, "rolled
back"). A spike before the first checkpoint, or more than `max_rollbacks` of them, stops the run, naming why.
"""
from __future__ import annotations

import json

import jax
import ml_collections
import numpy as np
from absl import logging

from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir

# Step losses the median needs before a step can be judged against it (a non-finite loss is judged always).
MIN_HISTORY = 4


def default_config() -> ml_collections.ConfigDict:
    """config.train.spike: off (factor 0)."""
    c = ml_collections.ConfigDict()
    # k: a step loss above k x the running median of step losses is a spike, and so is a non-finite one; 0 = off (a
    # non-finite loss then stops or skips its step by config.train.nan_policy)
    c.factor = 0.0
    c.window = 32  # step losses the running median is over
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
    """The running median of step losses, the counts, and the check. `rows`: metrics.jsonl's rows up to `start`,
    the step this start resumed from (a fresh run: 0, none), which hold the counts; the window comes from
    DIR/spike_windows.json's entry for `start` (none, from a checkpoint saved before there was one: the check
    judges again once MIN_HISTORY steps have a loss). Every process reads them, so every process decides alike."""

    def __init__(self, spike_cfg, rows: list[dict], workdir: str, start: int = 0):
        self.factor, self.window, self.max_rollbacks = spike_cfg.factor, spike_cfg.window, spike_cfg.max_rollbacks
        self.path = Workdir(workdir).spike_windows
        self.windows: dict[int, list[float]] = _read_windows(self.path) if start else {}
        self.losses = list(self.windows.get(start, []))[-self.window:]  # the last `window` step losses, oldest first
        self.judged = start  # the last step whose loss is in `losses`
        counted = next((r for r in reversed(rows) if "train/rollbacks" in r), {})
        self.rollbacks = int(counted.get("train/rollbacks", 0))
        self.skipped_batches = int(counted.get("train/skipped_batches", 0))

    def first_spike(self, pending: list[tuple[int, dict]]) -> tuple[int, float, float] | None:
        """(step, loss, median) of the first spike among `pending` ([(step, host metrics)], oldest first), or None.
        Each step not judged before is judged against the median of the step losses before it, and its loss then
        joins them: a check before a save and one at the next row judge each step once."""
        for step, metrics in pending:
            if step <= self.judged:
                continue
            loss = float(metrics["loss"])
            median = float(np.median(self.losses)) if len(self.losses) >= MIN_HISTORY else float("nan")
            if not np.isfinite(loss) or float(metrics.get("nonfinite", 0.0)) > 0:
                return step, loss, median
            if np.isfinite(median) and loss > self.factor * median:
                return step, loss, median
            self.losses = (self.losses + [loss])[-self.window:]
            self.judged = step
        return None

    def logged(self, step: int, row: dict) -> None:
        """A train row about to be written: the run's counts join it."""
        row["train/rollbacks"] = float(self.rollbacks)
        row["train/skipped_batches"] = float(self.skipped_batches)

    def saved(self, step: int, kept_steps) -> None:
        """Before `step`'s checkpoint is saved: the window as of `step`, written beside the windows of the steps
        still kept (`kept_steps`, and any newer one an asynchronous save has not committed yet)."""
        newest_kept = max(kept_steps, default=0)
        self.windows = {s: w for s, w in self.windows.items() if s in kept_steps or s > newest_kept}
        self.windows[step] = list(self.losses)
        if jax.process_index() == 0:
            paths.write_atomically(self.path, json.dumps({str(s): w for s, w in sorted(self.windows.items())}))

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
        """Counts the rollback; the window goes back to the one saved with `good`'s checkpoint."""
        step, loss, median = spike
        self.rollbacks += 1
        self.skipped_batches += step - good
        self.losses, self.judged = list(self.windows.get(good, [])), good
        logging.warning("loss spike at step %d: loss %.4g against a running median of %.4g (config.train.spike."
                        "factor=%g); rolled back to the checkpoint of step %d and skipped the %d batch(es) of steps "
                        "%d to %d (rollback %d of at most %d)", step, loss, median, self.factor, good, step - good,
                        good + 1, step, self.rollbacks, self.max_rollbacks)


def _read_windows(path) -> dict[int, list[float]]:
    """DIR/spike_windows.json as {step: its window}; {} where there is none."""
    return {int(s): w for s, w in json.loads(path.read_text()).items()} if path.exists() else {}
