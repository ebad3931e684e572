"""bert_jax/kernels/dropout_add_layer_norm.py: post-LN's LayerNorm(x + dropout(h)) as one custom VJP whose backward
re-draws the mask gives the unfused modules' outputs, gradients and masks for the same key."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import conftest
from bert_jax.families import get_family
from bert_jax.kernels import lean_backward
from bert_jax.kernels.dropout_add_layer_norm import dropout_add_layer_norm, keep_mask
from bert_jax.models.layers import DropoutKey

RATE = 0.25


def unfused(x, h, key, scale, bias, rate, epsilon, dtype):
    """What the layer computes without the fused op: flax's Dropout (with the mask drawn from `key`), the add, the
    lean norm, all through autodiff."""
    keep = jax.random.bernoulli(key, 1.0 - rate, h.shape)
    dropped = jax.lax.select(keep, h / (1.0 - rate), jnp.zeros_like(h))
    return lean_backward.layer_norm(x + dropped, scale, bias, epsilon, dtype)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_outputs_and_gradients_equal_the_unfused_ops_and_the_mask_is_the_same_draw(dtype):
    rng = np.random.default_rng(0)
    x, h = (jnp.asarray(rng.normal(size=(3, 8, 32)), dtype) for _ in range(2))
    scale, bias = jnp.asarray(rng.normal(size=32), jnp.float32), jnp.asarray(rng.normal(size=32), jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, 8, 32)), jnp.float32)
    key = jax.random.key(7)

    def loss(f):
        return lambda x, h, s, b: jnp.sum(f(x, h, key, s, b, RATE, 1e-12, dtype).astype(jnp.float32) * w)

    fused_grads = jax.jit(jax.grad(loss(dropout_add_layer_norm), argnums=(0, 1, 2, 3)))(x, h, scale, bias)
    plain_grads = jax.jit(jax.grad(loss(unfused), argnums=(0, 1, 2, 3)))(x, h, scale, bias)
    args = (x, h, key, scale, bias, RATE, 1e-12, dtype)
    assert jnp.array_equal(dropout_add_layer_norm(*args), unfused(*args))
    for fused, plain in zip(fused_grads, plain_grads):
        np.testing.assert_array_equal(np.asarray(fused, np.float32), np.asarray(plain, np.float32))
    # The backward's re-drawn mask is the forward's: h's gradient is zero exactly where dropout dropped.
    dropped = fused_grads[1] == 0
    assert jnp.array_equal(dropped, ~keep_mask(key, RATE, h.shape))
    assert 0.15 < float(dropped.mean()) < 0.35


def test_dropout_key_is_the_key_flax_dropout_draws_from_in_its_place():
    class Layer(nn.Module):
        fused: bool

        @nn.compact
        def __call__(self, h):
            if self.fused:
                return keep_mask(DropoutKey(name="Dropout_0")(), RATE, h.shape)
            return nn.Dropout(RATE)(h, deterministic=False) != 0

    h = jnp.ones((16, 64))
    rngs = {"dropout": jax.random.key(3)}
    assert jnp.array_equal(Layer(True).apply({}, h, rngs=rngs), Layer(False).apply({}, h, rngs=rngs))


@pytest.mark.slow  # a 2-layer BERT compiled twice: about a minute under load on 2 cores
def test_a_bert_with_the_fused_norm_trains_the_unfused_ones_loss_and_gradients():
    """The whole 2-layer model, hidden dropout on, the same dropout key: the same loss and gradients, which also
    means the same masks in every layer (config.model.fused_dropout_norm)."""
    batch = conftest.random_batch(0)
    family = get_family("bert")
    models = [family.build_model(conftest.small_model_config(dtype="bfloat16", fused_dropout_norm=fused,
                                                             attention_dropout_rate=0.0)) for fused in (False, True)]
    params = models[0].init({"params": jax.random.key(0)}, batch, deterministic=True)["params"]

    def value_and_grad(model):
        def loss(params):
            out = model.apply({"params": params}, batch, deterministic=False, rngs={"dropout": jax.random.key(1)})
            return jnp.mean(jnp.square(out["mlm_logits"].astype(jnp.float32)))
        return jax.jit(jax.value_and_grad(loss))(params)

    (plain_loss, plain_grads), (fused_loss, fused_grads) = map(value_and_grad, models)
    assert float(fused_loss) == float(plain_loss)
    for (path, e), g in zip(jax.tree_util.tree_flatten_with_path(plain_grads)[0], jax.tree.leaves(fused_grads)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e), err_msg=jax.tree_util.keystr(path))
