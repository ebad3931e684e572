"""The learning-curve diagnoser names each regime on synthetic curves shaped like real runs.

Train loss is logged every 10 steps with per-batch noise, validation every 100 steps on a
fixed set (little noise), over 1,000 steps: the shapes a fine-tuning run logs.
"""
import json
import math

import numpy as np
import pytest

from bert_jax.finetune import diagnosis

STEPS = np.arange(0, 1001, 10)
VAL_STEPS = np.arange(0, 1001, 100)


def _curves(train, val, metric, noise=0.02, val_noise=0.003, jump=0.0, seed=0):
    """`jump`: every other evaluation, the validation loss is that much higher and the metric lower."""
    rng = np.random.default_rng(seed)
    return diagnosis.Curves(
        train_loss=[(s, train(s) + noise * rng.normal()) for s in STEPS],
        val_loss=[(s, val(s) + jump * (i % 2) + val_noise * rng.normal()) for i, s in enumerate(VAL_STEPS)],
        val_metric=[(s, metric(s) - jump * (i % 2) + val_noise * rng.normal()) for i, s in enumerate(VAL_STEPS)],
        metric_name="accuracy", higher_is_better=True)


def _learned(tau):
    """A loss falling from 0.7 with time constant tau, and the accuracy that goes with it."""
    return (lambda s: 0.1 + 0.6 * math.exp(-s / tau),
            lambda s: 0.25 + 0.45 * math.exp(-s / tau),
            lambda s: 0.5 + 0.4 * (1 - math.exp(-s / tau)))


REGIME_CURVES = {
    "just right": _curves(*_learned(tau=150)),
    "could learn more": _curves(*_learned(tau=1200)),
    "learns nothing": _curves(lambda s: 0.69, lambda s: 0.69, lambda s: 0.5),
    "chaotic": _curves(*_learned(tau=150), noise=0.1, jump=0.2),
    "overlearning": _curves(
        lambda s: 0.005 + 0.7 * math.exp(-s / 60),
        lambda s: 0.4 + 0.3 * math.exp(-s / 60) + 0.0006 * s,
        lambda s: 0.5 + 0.3 * (1 - math.exp(-s / 60)) - 0.00005 * s),
}


@pytest.mark.parametrize("regime", diagnosis.REGIMES)
def test_each_regime_is_named_on_its_curves(regime):
    result = diagnosis.diagnose(REGIME_CURVES[regime], diagnosis.default_config())
    assert result.name == regime, result.evidence
    assert result.advice == diagnosis.ADVICE[regime]


def test_regimes_are_the_five_of_the_lecture():
    assert set(diagnosis.REGIMES) == {"just right", "could learn more", "learns nothing", "chaotic", "overlearning"}


def test_lower_is_better_metric_is_oriented():
    """A metric where lower is better (an error rate) reads the same as its complement."""
    curves = REGIME_CURVES["just right"]
    error = diagnosis.Curves(curves.train_loss, curves.val_loss, [(s, 1 - v) for s, v in curves.val_metric],
                             "error_rate", higher_is_better=False)
    assert diagnosis.diagnose(error, diagnosis.default_config()).name == "just right"


def test_a_loss_that_shoots_up_and_falls_back_to_its_start_has_learned_nothing():
    """A step far too large: the train loss leaps from chance (0.69) to 2.3 and falls back, the validation loss
    (first read at step 0, before any update, as fine-tuning runs do) never gets below where it started."""
    rng = np.random.default_rng(0)
    blowup = lambda s: 0.69 + 1.6 * (s / 50) * math.exp(1 - s / 50)  # noqa: E731  (peak 2.29 at step 50)
    curves = diagnosis.Curves(
        train_loss=[(s, blowup(s) + 0.05 * abs(rng.normal())) for s in STEPS[1:]],
        val_loss=[(s, blowup(s) + 0.02 * abs(rng.normal())) for s in VAL_STEPS],
        val_metric=[(s, 0.5) for s in VAL_STEPS], metric_name="accuracy", higher_is_better=True)
    result = diagnosis.diagnose(curves, diagnosis.default_config())
    assert result.name == "learns nothing", result.evidence
    # Without the step-0 point the same curves once read as learned: the start was the blow-up.
    late = diagnosis.Curves(curves.train_loss, curves.val_loss[1:], curves.val_metric[1:], "accuracy", True)
    assert diagnosis.diagnose(late, diagnosis.default_config()).name != "learns nothing"


def test_thresholds_come_from_the_config():
    cfg = diagnosis.default_config()
    cfg.saturated_max_gain = 10.0  # nothing counts as still improving
    assert diagnosis.diagnose(REGIME_CURVES["could learn more"], cfg).name == "just right"


def test_too_few_points_says_so_and_how_to_fix_it():
    curves = REGIME_CURVES["just right"]
    short = diagnosis.Curves(curves.train_loss, curves.val_loss[:2], curves.val_metric[:2], "accuracy", True)
    result = diagnosis.diagnose(short, diagnosis.default_config())
    assert result.name == diagnosis.TOO_FEW_POINTS
    assert "2 validation points" in result.advice and "min_points" in result.advice
    empty = diagnosis.Curves([], [], [], "accuracy", True)
    assert diagnosis.diagnose(empty, diagnosis.default_config()).name == diagnosis.TOO_FEW_POINTS


def test_non_finite_loss_is_a_divergence():
    curves = REGIME_CURVES["just right"]
    train = list(curves.train_loss)
    train[50] = (train[50][0], float("nan"))
    result = diagnosis.diagnose(diagnosis.Curves(train, curves.val_loss, curves.val_metric, "accuracy", True),
                                diagnosis.default_config())
    assert result.name == "chaotic"
    assert result.evidence["non_finite"] == "train loss is nan at step 500"


def test_non_finite_metric_points_are_ignored():
    curves = REGIME_CURVES["just right"]
    metric = [(s, float("nan")) if i == 0 else (s, v) for i, (s, v) in enumerate(curves.val_metric)]
    result = diagnosis.diagnose(diagnosis.Curves(curves.train_loss, curves.val_loss, metric, "spearman", True),
                                diagnosis.default_config())
    assert result.name == "just right"


def test_write_puts_json_and_plot_in_the_workdir(tmp_path):
    curves = REGIME_CURVES["overlearning"]
    result = diagnosis.diagnose(curves, diagnosis.default_config())
    diagnosis.write(str(tmp_path), curves, result)
    record = json.loads((tmp_path / "diagnosis.json").read_text())
    assert record["name"] == "overlearning"
    assert record["advice"] == diagnosis.ADVICE["overlearning"]
    assert record["evidence"]["gap_ratio"] > 2
    assert (tmp_path / "plots" / "learning_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# A real run's curves (tests/test_finetune.py's overlearning regime: MiniLM, 20 epochs on 100 examples of word-order
# detection, no label noise), train loss every 6th step, as measured.
OVERLEARNED_RUN = diagnosis.Curves(
    train_loss=[(6, 0.6959), (12, 0.6753), (18, 0.5809), (24, 0.3574), (30, 0.0963), (36, 0.0373), (42, 0.0179),
                (48, 0.0109), (54, 0.0077), (60, 0.0062), (66, 0.005), (72, 0.0048), (78, 0.0041), (84, 0.0039),
                (90, 0.0035), (96, 0.0033), (102, 0.0034), (108, 0.0033), (114, 0.0032), (120, 0.0032)],
    val_loss=[(0, 0.693), (12, 0.678), (24, 0.343), (36, 0.251), (48, 0.289), (60, 0.322), (72, 0.336), (84, 0.345),
              (96, 0.351), (108, 0.355), (120, 0.357), (125, 0.357)],
    val_metric=[(0, 0.4922), (12, 0.7188), (24, 0.9375)] + [(s, 0.9297) for s in range(36, 121, 12)] + [(125, 0.9297)],
    metric_name="accuracy", higher_is_better=True)


def test_the_overlearning_gap_is_read_where_the_validation_loss_is_lowest():
    """Not at the accuracy's first maximum (step 24, one example better than the plateau after it), where the train
    and validation losses are still level (0.36, 0.34), but at the validation loss's minimum (step 36: 0.25 against
    a train loss of 0.04)."""
    result = diagnosis.diagnose(OVERLEARNED_RUN, diagnosis.default_config())
    assert result.name == "overlearning", result.evidence
    assert result.evidence["best_step"] == 36
    assert result.evidence["gap_ratio"] == pytest.approx(0.251 / 0.0373, rel=0.05)  # train loss smoothed there


# --- runs at chance (issue 51): the metric, not the loss, says whether the model learned -----------------------

def _at_chance(train, val, accuracy=lambda s: 0.5, examples=500, chance=0.5, seed=0):
    """A run's curves with the chance its validation set gives (a balanced binary task: the majority class
    scores 0.5)."""
    c = _curves(train, val, accuracy, seed=seed)
    return diagnosis.Curves(c.train_loss, c.val_loss, c.val_metric, "accuracy", True, chance=chance,
                            examples=examples)


CHANCE_RUNS = {
    # Training rows of one class (the head of a file sorted by label): the train loss goes to 0 at once (always say
    # that class), the validation loss climbs as the model grows sure of it, the accuracy is the class's share.
    "single-class training data": _at_chance(lambda s: 0.01 + 0.68 * math.exp(-s / 20),
                                             lambda s: 0.69 + 2.5 * (1 - math.exp(-s / 200))),
    # Shuffled labels: the training set is memorised slowly, the validation loss rises, the accuracy is a coin.
    "shuffled labels": _at_chance(lambda s: 0.69 - 0.3 * s / 1000, lambda s: 0.69 + 0.2 * s / 1000,
                                  lambda s: 0.5 + 0.01 * math.sin(s / 100)),
    # A learning rate that diverges and falls back to the prior (the runs: accuracy 0.5, validation loss
    # 0.69 -> 1.26, train loss up and back down to where it started).
    "a learning rate that diverges": _at_chance(lambda s: 0.69 + 1.6 * (s / 50) * math.exp(1 - s / 50) + 0.3 * s / 1000,
                                                lambda s: 0.69 + 0.57 * min(s, 300) / 300),
}


@pytest.mark.parametrize("run", CHANCE_RUNS)
def test_a_run_at_chance_learns_nothing_whatever_its_loss_curve(run):
    result = diagnosis.diagnose(CHANCE_RUNS[run], diagnosis.default_config())
    assert result.name == "learns nothing", result.evidence
    assert result.evidence["chance"] == 0.5 and result.evidence["chance_margin"] == pytest.approx(2 * 0.5 / 500**0.5)


@pytest.mark.parametrize("run", CHANCE_RUNS)
def test_a_run_at_chance_is_never_just_right_even_without_its_chance(run):
    """Without the chance (a task kind that has none), the rising validation loss still keeps it from "just right"."""
    c = CHANCE_RUNS[run]
    blind = diagnosis.Curves(c.train_loss, c.val_loss, c.val_metric, "accuracy", True)
    assert diagnosis.diagnose(blind, diagnosis.default_config()).name not in ("just right", "could learn more")


def test_a_run_above_chance_keeps_its_regime():
    c = REGIME_CURVES["just right"]
    above = diagnosis.Curves(c.train_loss, c.val_loss, c.val_metric, "accuracy", True, chance=0.5, examples=500)
    result = diagnosis.diagnose(above, diagnosis.default_config())
    assert result.name == "just right" and result.evidence["final_metric"] > 0.5 + result.evidence["chance_margin"]
    # The margin is the validation set's: 0.88 is chance for a 90 % majority class, and a 4-example set is luck.
    assert diagnosis.diagnose(diagnosis.Curves(c.train_loss, c.val_loss, c.val_metric, "accuracy", True,
                                               chance=0.9, examples=500), diagnosis.default_config()).name \
        == "learns nothing"
    assert diagnosis.diagnose(diagnosis.Curves(c.train_loss, c.val_loss, c.val_metric, "accuracy", True,
                                               chance=0.5, examples=4), diagnosis.default_config()).name \
        == "learns nothing"


def test_a_validation_loss_that_ends_above_its_start_is_never_just_right():
    """The metric rose well above chance, the train and validation losses stayed level at the best point (no
    overlearning by the gap), but the validation loss ended above where it started."""
    rng = np.random.default_rng(0)
    curves = diagnosis.Curves(
        train_loss=[(s, 0.7 - 0.35 * (1 - math.exp(-s / 100)) + 0.01 * rng.normal()) for s in STEPS],
        val_loss=[(s, 0.69 - 0.2 * math.sin(math.pi * s / 1200) + 0.3 * (s / 1000) ** 3) for s in VAL_STEPS],
        val_metric=[(s, 0.5 + 0.3 * (1 - math.exp(-s / 100))) for s in VAL_STEPS],
        metric_name="accuracy", higher_is_better=True, chance=0.5, examples=500)
    result = diagnosis.diagnose(curves, diagnosis.default_config())
    assert result.evidence["val_end_minus_start"] > 0 and result.evidence.get("gap_ratio", 0) < 2, result.evidence
    assert result.name == "overlearning", result.evidence
