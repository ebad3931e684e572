"""Post-LN's `LayerNorm(x + dropout(h))` as one custom VJP whose backward draws the dropout mask again from its key.

Autodiff through `nn.Dropout`, the residual add and the norm keeps the keep-mask (a `pred` [batch, length, hidden]
per use, two per post-LN layer) from the forward to the backward: written once, read once and, in a scanned
stack, held in a zero-filled [layers, ...] buffer as well. Here the backward re-draws the mask from the key it was
drawn from, in the kernel that computes the gradient (threefry is counter-based: the same key gives the same bits,
and XLA fuses the draw into its consumer), so nothing but the sum's bf16 input to the norm and the norm's float32
statistics per token is kept (as kernels/lean_backward.py's `layer_norm` keeps).

The forward is nn.Dropout's, op for op: `bernoulli(key, 1 - rate, h.shape)` under jax_threefry_partitionable, and
`select(keep, h / (1 - rate), 0)`; then the lean norm. Outputs, gradients and masks equal the unfused modules' for
the same key (tests/test_dropout_add_layer_norm.py).

Shapes: x, h [..., hidden] in the compute dtype; scale, bias [hidden] (bias None: scale only); key a PRNG key.
"""
import functools

import jax
import jax.numpy as jnp

from bert_jax.kernels import lean_backward


def keep_mask(key: jax.Array, rate: float, shape: tuple[int, ...]) -> jax.Array:
    """bool `shape`: the elements dropout keeps, drawn as flax's nn.Dropout draws them from `key`."""
    return jax.random.bernoulli(key, 1.0 - rate, shape)


def _dropped(h: jax.Array, keep: jax.Array, rate: float) -> jax.Array:
    return jax.lax.select(keep, h / (1.0 - rate), jnp.zeros_like(h))  # nn.Dropout's inputs / keep_prob


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def dropout_add_layer_norm(x: jax.Array, h: jax.Array, key: jax.Array, scale: jax.Array, bias: jax.Array | None,
                           rate: float, epsilon: float, dtype) -> jax.Array:
    """LayerNorm(x + dropout(h)) over the last axis, statistics in float32, cast to dtype; dropout at `rate` > 0
    with the mask of `key`."""
    return _forward(x, h, key, scale, bias, rate, epsilon, dtype)[0]


def _forward(x, h, key, scale, bias, rate, epsilon, dtype):
    summed = x + _dropped(h, keep_mask(key, rate, h.shape), rate)
    y, (_, mean, rstd, _, _) = lean_backward._layer_norm_fwd(summed, scale, bias, epsilon, dtype)
    dtypes = (jnp.zeros((0,), x.dtype), jnp.zeros((0,), h.dtype))  # the inputs' dtypes, for their cotangents
    return y, (summed, mean, rstd, scale, bias, key, dtypes)


def _backward(rate, epsilon, dtype, residuals, g):
    summed, mean, rstd, scale, bias, key, (x_dtype, h_dtype) = residuals
    d_summed, d_scale, d_bias = lean_backward._layer_norm_bwd(epsilon, dtype, (summed, mean, rstd, scale, bias), g)
    keep = keep_mask(key, rate, d_summed.shape)  # the forward's mask, drawn again: no mask was kept
    d_dropped = d_summed.astype(h_dtype.dtype)  # the add's transpose (a cast where x + dropout(h) promoted)
    d_h = jax.lax.select(keep, d_dropped, jnp.zeros_like(d_dropped)) / (1.0 - rate)  # autodiff's order: select, /
    return d_summed.astype(x_dtype.dtype), d_h, None, d_scale, d_bias


dropout_add_layer_norm.defvjp(_forward, _backward)
