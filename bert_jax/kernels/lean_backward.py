"""LayerNorm and GELU whose backward keeps only their input in the compute dtype and recomputes the rest.

Autodiff keeps what a backward reads. For flax's LayerNorm on a bf16 input, computed in float32, that is the
centred input, it times the reciprocal deviation, and their product with the scale: three float32 [batch, length,
hidden] arrays per norm. For the exact GELU on a bf16 [batch, length, intermediate] it is four arrays (x / 2,
erfc(-x / sqrt 2), exp(-x^2 / 2), ...). In a scanned stack every one of these is a stacked [layers, ...] buffer
the step zero-fills, the forward writes and the backward reads: on XLA's GPU compiler, BERT-base (128, 256) moves
about 50 GB of its 179 GB per step through them (docs/results/gpu.md). `layer_norm` and `gelu` compute the same
forward, op for op (bit-identical outputs), and keep only the input (which the step keeps anyway: it is a dot's
output or a residual sum), plus the norm's float32 mean and reciprocal deviation per token; their backward
recomputes the rest in float32, in the kernel that computes the gradient. Gradients equal autodiff's through
flax's norm and jax's GELU to rounding (tests/test_lean_backward.py).
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np


def _statistics(x: jax.Array, epsilon: float) -> tuple[jax.Array, jax.Array]:
    """Float32 mean and reciprocal deviation over the last axis, as flax computes them (the fast variance,
    E[x^2] - E[x]^2, clipped at 0)."""
    xf = x.astype(jnp.float32)
    mean = jnp.mean(xf, -1, keepdims=True)
    var = jnp.maximum(jnp.mean(jnp.square(xf), -1, keepdims=True) - jnp.square(mean), 0.0)
    return mean, jax.lax.rsqrt(var + epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array | None, epsilon: float, dtype) -> jax.Array:
    """LayerNorm over the last axis: (x - mean) * rsqrt(var + epsilon) * scale + bias, in float32, cast to dtype.
    bias None: scale only."""
    return _layer_norm_fwd(x, scale, bias, epsilon, dtype)[0]


def _layer_norm_fwd(x, scale, bias, epsilon, dtype):
    mean, rstd = _statistics(x, epsilon)
    y = (x - mean) * (rstd * scale)  # flax's order: y = x - mean; y *= rsqrt(var + eps) * scale; y += bias
    if bias is not None:
        y = y + bias
    return y.astype(dtype), (x, mean, rstd, scale, bias)  # bias: only whether there is one (tiny)


def _layer_norm_bwd(epsilon, dtype, residuals, g):
    del epsilon, dtype
    x, mean, rstd, scale, bias = residuals
    g = g.astype(jnp.float32)
    xhat = (x.astype(jnp.float32) - mean) * rstd
    batch_axes = tuple(range(g.ndim - 1))
    d_scale = jnp.sum(g * xhat, batch_axes).astype(scale.dtype)
    d_bias = None if bias is None else jnp.sum(g, batch_axes).astype(bias.dtype)
    d_xhat = g * scale
    d_x = rstd * (d_xhat - jnp.mean(d_xhat, -1, keepdims=True) - xhat * jnp.mean(d_xhat * xhat, -1, keepdims=True))
    return d_x.astype(x.dtype), d_scale, d_bias


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


@jax.custom_vjp
def gelu(x: jax.Array) -> jax.Array:
    """The exact (erf) GELU, x * (1 + erf(x / sqrt 2)) / 2, as jax.nn.gelu(approximate=False) computes it."""
    return jax.nn.gelu(x, approximate=False)


def _gelu_fwd(x):
    return gelu(x), x


def _gelu_bwd(x, g):
    xf = x.astype(jnp.float32)
    cdf = 0.5 * (1.0 + jax.lax.erf(xf * np.float32(1 / np.sqrt(2))))
    pdf = jnp.exp(-0.5 * jnp.square(xf)) * np.float32(1 / np.sqrt(2 * np.pi))
    return ((cdf + xf * pdf) * g.astype(jnp.float32)).astype(x.dtype),


gelu.defvjp(_gelu_fwd, _gelu_bwd)
