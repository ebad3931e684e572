"""A fine-tuning run validates often enough for its learning curves to be diagnosed, whatever its length, and
no more often than that: the rule of bert_jax/finetune/cadence.py, without compiling anything."""
import math

import pytest

import bert_jax.configs.finetune.classification
from bert_jax.finetune import diagnosis
from bert_jax.finetune.cadence import make_cadence


def validation_steps(cadence) -> list[int]:
    return [s for s in range(cadence.num_steps + 1) if cadence.validates_at(s)]


@pytest.mark.parametrize("examples, epochs", [(100, 3.0), (1_000, 3.0), (8_000, 3.0), (67_000, 3.0), (300, 20.0),
                                              (40, 1.0)])
def test_the_default_run_validates_enough_times_to_be_diagnosed_and_a_bounded_number(examples, epochs):
    c = bert_jax.configs.finetune.classification.get_config()
    steps_per_epoch = math.ceil(examples / c.train.batch_size)
    num_steps = math.ceil(epochs * examples / c.train.batch_size)
    cadence = make_cadence(c.train, c.checkpoint, num_steps, steps_per_epoch)
    points = validation_steps(cadence)
    assert points[0] == 0  # the untrained model, where every drop is measured from
    assert points[-1] == num_steps
    assert len(points) >= min(num_steps, c.train.evals_per_run) + 1
    assert len(points) >= diagnosis.default_config().min_points or num_steps < diagnosis.default_config().min_points
    assert len(points) <= 2 * c.train.evals_per_run + 2  # validation costs the same in a long run as in a short one
    train_points = [s for s in range(1, num_steps + 1) if s % cadence.log_every == 0 or s == num_steps]
    assert len(train_points) >= len(points) - 1  # the train curve is read as finely as the validation curve
    assert cadence.save_every == steps_per_epoch  # more evaluations, not more checkpoints


def test_eval_every_steps_overrides_the_count_and_bad_values_name_the_keys():
    c = bert_jax.configs.finetune.classification.get_config()
    c.train.eval_every_steps = 7
    assert validation_steps(make_cadence(c.train, c.checkpoint, 30, 10)) == [0, 7, 14, 21, 28, 30]
    c.train.eval_every_steps, c.train.evals_per_run = 0, 0
    with pytest.raises(ValueError, match="config.train.evals_per_run=0"):
        make_cadence(c.train, c.checkpoint, 30, 10)
