import flax.linen as nn
import jax
import ml_collections
import numpy as np
import pytest
from conftest import random_batch, small_model_config
from numerics import REORDERED, assert_close

from bert_jax.configs import base
from bert_jax.families import get_family
from bert_jax.train.optimizer import decay_mask, learning_rate_schedule, make_optimizer
from bert_jax.train.state import make_init_fn
from bert_jax.train.step import make_train_step


def train_config(**overrides):
    """configs/base.py's train block (every key a layer reads is declared there), with these values."""
    cfg = base.get_config().train.to_dict()
    cfg.update(optimizer="adamw", learning_rate=1e-3, warmup_steps=10, num_steps=200, end_learning_rate=0.0,
               b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, max_grad_norm=1.0)
    cfg.update(overrides)
    return ml_collections.ConfigDict(cfg)


DATA = ml_collections.ConfigDict(dict(max_seq_length=16, max_predictions_per_seq=5, example_builder="nsp"))


def setup(model_overrides=None, **train_overrides):
    family = get_family("bert")
    model = family.build_model(small_model_config(**(model_overrides or {})))
    t = train_config(**train_overrides)
    tx = make_optimizer(t)
    state = jax.jit(make_init_fn(model, tx, DATA, seed=0))()
    return model, family.objective, tx, state


@pytest.mark.slow  # the default suite's budget: every pre-training test trains the same step
def test_small_model_overfits_one_fixed_batch():
    model, objective, tx, state = setup({"dropout_rate": 0.0, "attention_dropout_rate": 0.0}, num_steps=300)
    batch = random_batch(0, batch=8)
    step = jax.jit(make_train_step(model, objective, tx, 1))
    losses = []
    for _ in range(300):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.1 * losses[0], (losses[0], losses[-1])


def test_gradient_accumulation_gives_the_one_shot_update():
    model, objective, tx, state = setup({"dropout_rate": 0.0, "attention_dropout_rate": 0.0})
    batch = random_batch(3, batch=8)
    # Uneven masked counts per example, so per-micro-batch averaging would differ.
    batch["masked_weights"] = batch["masked_weights"].at[::2, 2:].set(0.0)
    one, m1 = jax.jit(make_train_step(model, objective, tx, 1))(state, batch)
    four, m4 = jax.jit(make_train_step(model, objective, tx, 4))(state, batch)
    # Four partial sums added in another order: relative to magnitude.
    assert_close([m4["loss"], m4["grad_norm"]], [m1["loss"], m1["grad_norm"]], REORDERED)
    # Adam's moments hold the accumulated gradient (mu = 0.1 g, nu = 0.001 g^2). The params cannot tell: the
    # warm-up's learning rate is 0 at step 0, and Adam's first step is ~lr * sign(g) whatever g's size.
    assert_close(four.opt_state, one.opt_state, REORDERED)


@pytest.mark.slow  # the default suite's time budget; test_pretrain's diverging run stops at a NaN in the default suite
def test_nan_loss_leaves_the_state_untouched():
    model, objective, tx, state = setup()
    batch = random_batch(0)
    batch["masked_weights"] = batch["masked_weights"].at[0, 0].set(np.nan)
    new, metrics = jax.jit(make_train_step(model, objective, tx, 1))(state, batch)
    assert float(metrics["nonfinite"]) == 1.0
    jax.tree.map(np.testing.assert_array_equal, new.params, state.params)
    assert int(new.step) == 1


def test_schedule_warms_up_then_decays_linearly_to_zero():
    s = learning_rate_schedule(train_config(learning_rate=1e-3, warmup_steps=10, num_steps=110))
    # A few float32 operations on values <= 1e-3 round by < 1e-10: 1e-9 is 1e-6 of the peak on any machine.
    np.testing.assert_allclose([s(0), s(5), s(10), s(60), s(110)], [0, 5e-4, 1e-3, 5e-4, 0], atol=1e-9)


def test_no_weight_decay_on_layernorm_scales_and_biases():
    model = get_family("bert").build_model(small_model_config())
    params = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), random_batch(0))["params"]))
    mask = decay_mask(params)
    layer = mask["encoder"]["stack"]["layers"]
    assert layer["attention"]["query"]["kernel"] and not layer["attention"]["query"]["bias"]
    assert not layer["mlp_norm"]["norm"]["scale"] and not mask["mlm_output_bias"]
    assert mask["encoder"]["embeddings"]["word"]["embedding"]
