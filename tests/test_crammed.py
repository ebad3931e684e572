"""Cramming's recipe (configs/crammed.py): its one-cycle schedule and its batch ramped by accumulation."""
import numpy as np
import pytest

import bert_jax
import bert_jax.configs.crammed
from bert_jax.train import stages
from bert_jax.train.config_validation import check_config
from bert_jax.train.optimizer import learning_rate_schedule


def onecycle(**keys):
    train_cfg = bert_jax.configs.crammed.get_config().train
    train_cfg.update(num_steps=20, learning_rate=1e-3, **keys)
    return train_cfg


def test_onecycle_rises_from_its_start_factor_to_the_peak_then_falls_to_the_end():
    s = learning_rate_schedule(onecycle())
    rates = np.asarray(s(np.arange(20)))  # count 0 is the first step's
    # 0.25 x the peak, the peak at step 15 (0.75 x 20), 0 at the last: a float32 rounding of 1e-3 is < 1e-10.
    np.testing.assert_allclose(rates[[0, 7, 14, 19]], [2.5e-4, 2.5e-4 + 7 * 7.5e-4 / 14, 1e-3, 0.0], atol=1e-9)
    assert np.all(np.diff(rates[:15]) > 0) and np.all(np.diff(rates[14:]) < 0)


@pytest.mark.parametrize("keys, message", [
    (dict(warmup_steps=5), "config.train.warmup_steps=5 with config.train.schedule='onecycle', whose rise is its "
                           "warmup"),
    (dict(onecycle_peak_fraction=1.0), "config.train.onecycle_peak_fraction=1.0 must be in (0, 1)"),
    (dict(onecycle_start_factor=1.5), "config.train.onecycle_start_factor=1.5 must be in [0, 1]"),
])
def test_a_onecycle_key_out_of_range_is_refused_naming_it(keys, message):
    with pytest.raises(ValueError) as refused:
        learning_rate_schedule(onecycle(**keys))
    assert message in str(refused.value)


def test_the_batch_ramps_by_accumulation_the_micro_batch_staying():
    plan = stages.plan(bert_jax.configs.crammed.get_config())
    batches = [(s.config.train.global_batch_size, s.config.train.grad_accum_steps) for s in plan]
    assert batches[0] == (128, 1) and batches[-1] == (4096, 32), batches
    assert {batch // accumulation for batch, accumulation in batches} == {128}  # Cramming's micro-batch throughout
    # The ramp ends at 60 % of the tokens: the full batch's stage trains the other 40 %.
    last = plan[-1]
    tokens = sum((s.end - s.start) * s.config.train.global_batch_size for s in plan) * 128
    assert 0.39 < (last.end - last.start) * 4096 * 128 / tokens < 0.41


@pytest.mark.parametrize("keys, message", [
    (dict(stages=(dict(start=5, train=dict(grad_accum_steps=2)),)),
     "config.train.stages[0] changes train.grad_accum_steps, which config.train.batch_size_warmup drives"),
    (dict(grad_accum_steps=16), "config.train.batch_size_warmup.start_batch_size=8 with accumulate=True must be a "
                                "multiple of config.train.grad_accum_steps=16"),
])
def test_a_ramp_by_accumulation_refuses_what_would_change_its_micro_batch(keys, message):
    c = bert_jax.configs.crammed.get_config("tiny")
    c.train.update(**keys)
    with pytest.raises(bert_jax.UserError) as refused:
        check_config(c)
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
