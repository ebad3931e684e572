"""Learning curves that diagnose themselves: one of five named regimes, with the advice that fits.

The seed lecture's advice is "examine the learning curves". A fine-tuning user who sees only a
final accuracy cannot tell a run that needed more epochs from one that overlearned or one whose
step was too large. The rules below read the train loss, the validation loss and the validation
metric the way a practitioner reads the plot, with every threshold in `default_config()` (placed
at `config.diagnosis` by the fine-tuning configs) so a user can tune them.

Definitions (curves sorted by step; "smoothed" is a 3-point running median, which removes a
single odd evaluation but keeps a trend):

- drop: how much a loss fell, relative to where it started. Train: (start - mean of the last
  `tail_fraction` of points) / start, where start is the mean of the first `head_fraction` of
  points (per-batch train losses are noisy, so both ends are averaged), or the validation loss
  of the untrained model if the validation curve starts before the train curve (fine-tuning runs
  validate at step 0) and that is lower: a loss that shot up in the first steps (a step far too
  large) and came back to where it started has not dropped. Validation: (first value - lowest
  smoothed value) / first value; the validation set is fixed, so its first point is exact.
- learned: the train drop or the validation drop reaches `learned_min_drop`.
- jumpiness: root-mean-square of a validation curve around its smoothed self, divided by what
  that curve gained (its drop in loss units, or the metric's best smoothed gain). The larger of
  the loss's and the metric's.
- projected gain: the least-squares slope of a validation curve over its last `tail_fraction`
  of points, extrapolated over the run's length, divided by what the curve gained so far:
  "running as long again would add this fraction of what was learned".
- best point: the step of the lowest smoothed validation loss. Gap ratio: validation loss /
  smoothed train loss there. An overlearning run has fitted its training set far better than the
  validation set by the time validation is at its best (a pre-trained MiniLM, 20 epochs on 100
  examples: 0.25 against 0.04), and the gap is read there rather than at the end, where any run
  that trains long enough has a train loss near 0. The loss, not the metric, marks the point: a
  metric counts whole examples, so it plateaus, and its first maximum can come a validation
  before the loss's minimum, while train and validation losses are still level (the same run:
  accuracy 0.938 at step 24, losses 0.36 and 0.34; 0.930 at the loss's minimum, step 36).
  Validation rise: (last smoothed validation loss - its minimum) / its minimum.

- chance: the validation metric of the constant predictor the training rows suggest (the
  majority class, the mean label: Task.chance), and its margin, `chance_z` standard errors of
  the metric on the validation set's size (metrics.chance_margin). A final metric within the
  margin of chance (or below it) is a model that learned nothing a constant could not say,
  whatever its losses did: a training set of one class, shuffled labels, a step so large the
  model falls back to predicting the prior (validation loss 0.69 -> 1.26, accuracy 0.5).

Rules, first match wins:

1. fewer than `min_points` train or validation points: "too few points" (not one of the five
   regimes; evaluate more often);
2. a non-finite train or validation loss: "chaotic" (the run diverged; a smaller step);
3. the final validation metric at chance: "learns nothing";
4. not learned: "learns nothing";
5. jumpiness >= `chaotic_min_jumpiness`: "chaotic";
6. gap ratio >= `overlearning_min_gap_ratio` and validation rise >= `overlearning_min_val_rise`:
   "overlearning" (the train curve fell faster than validation: train loss far below
   validation loss at the best point, and the validation loss turned up after its minimum);
7. the validation loss ends above where it started: "overlearning" when the train loss fell,
   else "chaotic" (never "just right": the model got worse on data it did not train on);
8. projected gain of the validation loss or metric >= `saturated_max_gain`: "could learn more";
9. otherwise "just right".
"""
from __future__ import annotations

import dataclasses
import io
import json
import math
from typing import Any

import ml_collections
import numpy as np

from bert_jax.finetune import metrics
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir

JUST_RIGHT = "just right"
COULD_LEARN_MORE = "could learn more"
LEARNS_NOTHING = "learns nothing"
CHAOTIC = "chaotic"
OVERLEARNING = "overlearning"
REGIMES = (JUST_RIGHT, COULD_LEARN_MORE, LEARNS_NOTHING, CHAOTIC, OVERLEARNING)
# Not a regime: the curves are too short to read.
TOO_FEW_POINTS = "too few points"

# The seed lecture's advice for each regime.
ADVICE = {
    JUST_RIGHT: "Nothing to change: the model learned, saturated before the end and did not overlearn.",
    COULD_LEARN_MORE: "Train longer (more epochs) or take a larger step (a higher learning rate).",
    LEARNS_NOTHING: "Take a larger step (a higher learning rate), a smaller batch, or get more labelled data.",
    CHAOTIC: "Take a smaller step (a lower learning rate) or a larger batch.",
    OVERLEARNING: "Regularise more (more weight decay), take a smaller step, or get more data.",
}

PLOT_FILE = "learning_curves.png"  # in DIR/plots/


def default_config() -> ml_collections.ConfigDict:
    """Thresholds of the rules in this module's docstring."""
    return ml_collections.ConfigDict(dict(
        min_points=4,  # fewer train or validation points than this: "too few points"
        head_fraction=0.1,  # share of train points averaged as the starting loss
        tail_fraction=0.3,  # share of points averaged (train) or fitted (validation slope) at the end
        learned_min_drop=0.1,  # relative loss drop that counts as having learned
        chaotic_min_jumpiness=0.2,  # validation jitter, as a fraction of what was gained
        overlearning_min_gap_ratio=2.0,  # validation loss / train loss at the best point
        overlearning_min_val_rise=0.2,  # validation loss rise after its minimum, relative to that minimum
        saturated_max_gain=0.2,  # projected gain over another run length, as a fraction of the gain so far
        chance_z=metrics.CHANCE_Z,  # standard errors within which a final metric is at chance
    ))


@dataclasses.dataclass
class Curves:
    """(step, value) pairs, as logged; any order."""
    train_loss: list[tuple[float, float]]
    val_loss: list[tuple[float, float]]
    val_metric: list[tuple[float, float]]
    metric_name: str
    higher_is_better: bool
    chance: float | None = None  # the metric of the constant predictor (Task.chance); None: unknown
    examples: int = 0  # the validation set's size, which sets the margin around chance


@dataclasses.dataclass
class Diagnosis:
    name: str
    advice: str
    evidence: dict[str, Any]

    def __str__(self) -> str:
        return f"diagnosis: {self.name}. {self.advice}"


def _arrays(points) -> tuple[np.ndarray, np.ndarray]:
    points = sorted((float(s), float(v)) for s, v in points)
    if not points:
        return np.zeros(0), np.zeros(0)
    steps, values = zip(*points)
    return np.asarray(steps), np.asarray(values)


def _smoothed(values: np.ndarray) -> np.ndarray:
    """3-point running median; the end points stay as they are."""
    if len(values) < 3:
        return values.copy()
    out = values.copy()
    out[1:-1] = np.median(np.stack([values[:-2], values[1:-1], values[2:]]), axis=0)
    return out


def _count(n: int, fraction: float, minimum: int = 1) -> int:
    return min(n, max(minimum, math.ceil(fraction * n)))


def _jumpiness(values: np.ndarray, gained: float) -> float:
    residual = values - _smoothed(values)
    return float(np.sqrt(np.mean(residual**2)) / gained)


def _projected_gain(steps: np.ndarray, improvement: np.ndarray, gained: float, cfg) -> float:
    """Improvement (higher is better) that the tail's slope would add over another run length."""
    k = _count(len(steps), cfg.tail_fraction, minimum=2)
    if steps[-1] == steps[-k]:
        return 0.0
    slope = np.polyfit(steps[-k:], improvement[-k:], 1)[0]
    return float(slope * (steps[-1] - steps[0]) / gained)


def _first_non_finite(name: str, steps: np.ndarray, values: np.ndarray) -> str | None:
    bad = np.flatnonzero(~np.isfinite(values))
    return f"{name} is {values[bad[0]]} at step {steps[bad[0]]:g}" if len(bad) else None


def diagnose(curves: Curves, cfg: ml_collections.ConfigDict) -> Diagnosis:
    """Names the regime of a run from its learning curves (rules in the module docstring)."""
    t_steps, train = _arrays(curves.train_loss)
    v_steps, val = _arrays(curves.val_loss)
    m_steps, metric = _arrays(curves.val_metric)
    evidence: dict[str, Any] = {"train_points": len(train), "val_points": len(val), "metric_points": len(metric)}

    def verdict(name: str, rule: str) -> Diagnosis:
        evidence["rule"] = rule
        return Diagnosis(name, ADVICE.get(name, ""), evidence)

    if min(len(train), len(val)) < cfg.min_points:
        return Diagnosis(
            TOO_FEW_POINTS,
            f"The curves hold {len(train)} train and {len(val)} validation points; the diagnosis needs "
            f"at least {cfg.min_points} of each (config.diagnosis.min_points): evaluate more often.",
            evidence | {"rule": "fewer points than min_points"})
    non_finite = _first_non_finite("train loss", t_steps, train) or _first_non_finite("validation loss", v_steps, val)
    if non_finite:
        evidence["non_finite"] = non_finite
        return verdict(CHAOTIC, "a loss became non-finite: the run diverged")
    # A non-finite metric alone (an undefined correlation) says nothing about the regime.
    finite = np.isfinite(metric)
    m_steps, metric = m_steps[finite], metric[finite]
    if curves.chance is not None and len(metric):
        margin = metrics.chance_margin(curves.metric_name, curves.examples, cfg.chance_z)
        evidence.update(final_metric=float(metric[-1]), chance=curves.chance, chance_margin=margin)
        if metrics.at_chance(float(metric[-1]), curves.chance, margin, curves.higher_is_better):
            return verdict(LEARNS_NOTHING, f"the final validation {curves.metric_name} is within chance_z standard "
                                           f"errors of the constant predictor's")

    head = train[:_count(len(train), cfg.head_fraction)].mean()
    if v_steps[0] < t_steps[0]:
        head = min(head, val[0])
    tail = train[-_count(len(train), cfg.tail_fraction):].mean()
    train_drop = float((head - tail) / abs(head)) if head else 0.0
    val_smooth = _smoothed(val)
    val_min = float(val_smooth.min())
    val_drop = float((val[0] - val_min) / abs(val[0])) if val[0] else 0.0
    evidence.update(train_drop=train_drop, val_drop=val_drop)
    if max(train_drop, val_drop) < cfg.learned_min_drop:
        return verdict(LEARNS_NOTHING, "neither the train nor the validation loss fell by learned_min_drop")

    # What each validation curve gained, floored so a curve that barely moved cannot divide by ~0.
    loss_gained = max(val[0] - val_min, cfg.learned_min_drop * abs(val[0]), 1e-12)
    jumpiness = _jumpiness(val, loss_gained)
    oriented = metric if curves.higher_is_better else -metric
    if len(metric) >= cfg.min_points:
        metric_gained = max(float(_smoothed(oriented).max() - oriented[0]), cfg.learned_min_drop * max(abs(oriented[0]), 1e-3))
        metric_jumpiness = _jumpiness(oriented, metric_gained)
        evidence["metric_jumpiness"] = metric_jumpiness
        jumpiness = max(jumpiness, metric_jumpiness)
    evidence["jumpiness"] = jumpiness
    if jumpiness >= cfg.chaotic_min_jumpiness:
        return verdict(CHAOTIC, "the validation curve jumps by chaotic_min_jumpiness of what it gained")

    best_step = float(v_steps[int(np.argmin(val_smooth))])
    train_at_best = float(np.interp(best_step, t_steps, _smoothed(train)))
    val_at_best = float(np.interp(best_step, v_steps, val))
    gap_ratio = val_at_best / max(train_at_best, 1e-12)
    val_rise = (float(val_smooth[-1]) - val_min) / max(abs(val_min), 1e-12)
    evidence.update(best_step=best_step, train_loss_at_best=train_at_best, val_loss_at_best=val_at_best,
                    gap_ratio=gap_ratio, val_rise=val_rise)
    if gap_ratio >= cfg.overlearning_min_gap_ratio and val_rise >= cfg.overlearning_min_val_rise:
        return verdict(OVERLEARNING, "train loss far below validation loss at the best point, and the validation "
                                     "loss rose after its minimum")

    val_end_rise = float(val_smooth[-1] - val[0])
    evidence["val_end_minus_start"] = val_end_rise
    if val_end_rise > 0:
        if train_drop >= cfg.learned_min_drop:
            return verdict(OVERLEARNING, "the validation loss ended above where it started while the train loss fell")
        return verdict(CHAOTIC, "the validation loss ended above where it started and the train loss did not fall")

    gain = _projected_gain(v_steps, -val, loss_gained, cfg)
    evidence["val_loss_projected_gain"] = gain
    if len(metric) >= cfg.min_points:
        metric_gain = _projected_gain(m_steps, oriented, metric_gained, cfg)
        evidence["metric_projected_gain"] = metric_gain
        gain = max(gain, metric_gain)
    if gain >= cfg.saturated_max_gain:
        return verdict(COULD_LEARN_MORE, "the validation curves still improve at the end (saturated_max_gain)")
    return verdict(JUST_RIGHT, "learned, saturated, no overlearning")


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def write(workdir: str, curves: Curves, result: Diagnosis) -> None:
    """Writes DIR/diagnosis.json and DIR/plots/learning_curves.png, each whole (DIR may be a bucket)."""
    run = Workdir(workdir)
    record = {"name": result.name, "advice": result.advice, "evidence": result.evidence,
              "metric_name": curves.metric_name, "higher_is_better": curves.higher_is_better}
    paths.write_atomically(run.diagnosis_json, json.dumps(_json_safe(record), indent=2) + "\n")

    # matplotlib costs about half a second to load, and only plots need it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"), so no display is needed

    fig, (loss_ax, metric_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for label, points, marker in (("train loss", curves.train_loss, None),
                                  ("validation loss", curves.val_loss, "o")):
        if points:
            loss_ax.plot(*_arrays(points), label=label, marker=marker)
    loss_ax.set_ylabel("loss")
    if curves.val_metric:
        metric_ax.plot(*_arrays(curves.val_metric), label=f"validation {curves.metric_name}", marker="o", color="C1")
    metric_ax.set_ylabel(curves.metric_name)
    for ax in (loss_ax, metric_ax):
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{result.name}: {result.advice}", fontsize=9)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    paths.write_atomically(run.plots / PLOT_FILE, png.getvalue())
