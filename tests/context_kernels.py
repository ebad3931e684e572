"""The context axis's attention kernels (ring, halo) against xla_attention, outputs and gradients, as JSON.

Run as a script on simulated devices (tests/test_context_parallel.py does):

    XLA_FLAGS=--xla_force_host_platform_device_count=16 python tests/context_kernels.py

Micro shapes: 2 packed rows of 32 tokens (documents and the padding tail cut across the 8-token shards' edges), on a
mesh data=2, context=4, tensor=2 (16 devices: rows, sequence and heads split). Prints, per case, the largest
difference of the output and of each gradient from the reference's.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax.kernels import attention, context_attention  # noqa: E402
from bert_jax.parallel.mesh import RULE_PRESETS, make_mesh  # noqa: E402

# (name, kernel, window, causal)
CASES = (
    ("ring", "ring", None, False),
    ("ring_causal_wide_window", "ring", 10, True),  # a window wider than a shard goes round the ring too
    ("halo", "halo", 3, False),
    ("halo_causal", "halo", 3, True),
)


def inputs():
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 32, 2, 8)), jnp.float32) for _ in range(3))
    segments = np.zeros((2, 32), np.int32)
    segments[0, 5:19], segments[0, 19:] = 1, 2  # documents crossing the edges at 8, 16 and 24
    segments[1, 11:], segments[1, 27:] = 1, -1  # a padding tail inside the last shard
    return q, k, v, jnp.asarray(segments)


def outputs_and_grads(attend, shape=(2, 32, 2, 8), seed: int = 1):
    """attend(q, k, v, segments) and the gradients of a weighted sum of it (its outputs `shape`)."""
    weights = jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)
    loss = lambda *a: jnp.sum(attend(*a) * weights)  # noqa: E731
    return lambda *a: (attend(*a), jax.grad(loss, (0, 1, 2))(*a))


def splash_inputs():
    """2 packed rows of 512 tokens (splash's blocks are 128 wide: 128 a shard at context 4), documents and the
    padding tail crossing the shards' edges, 2 heads of 64."""
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 512, 2, 64)), jnp.float32) for _ in range(3))
    segments = np.zeros((2, 512), np.int32)
    segments[0, 100:300], segments[0, 300:] = 1, 2
    segments[1, 200:], segments[1, 450:] = 1, -1
    return q, k, v, jnp.asarray(segments)


def splash_main() -> None:
    """Splash over the all-gathered keys (interpret mode) against xla_attention, rows over data, the sequence over
    context (8 devices)."""
    q, k, v, segments = splash_inputs()
    both = lambda attend: outputs_and_grads(attend, q.shape, seed=3)  # noqa: E731
    want = jax.jit(both(lambda q, k, v, s: attention.xla_attention(q, k, v, s, None)))(q, k, v, segments)
    mesh = make_mesh(ml_collections.ConfigDict(dict(shape=(2, 1, 1), context=4)))
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULE_PRESETS["fsdp_tp"]):
        got = jax.jit(both(lambda q, k, v, s: context_attention.splash_over_gathered(q, k, v, s, True)))(
            q, k, v, segments)
    real = (segments >= 0)[:, :, None, None]  # padding queries' outputs differ between kernels (kernels/attention.py)
    out = {"output": float(jnp.max(jnp.abs(jnp.where(real, got[0] - want[0], 0))))}
    out.update({f"d{x}": float(jnp.max(jnp.abs(a - b))) for x, a, b in zip("qkv", got[1], want[1])})
    print("RESULT " + json.dumps({"splash_over_gathered": out}), flush=True)


def main() -> None:
    if "--splash" in sys.argv:
        return splash_main()
    q, k, v, segments = inputs()
    want, got = {}, {}
    for name, kernel, window, causal in CASES:
        split = context_attention.ring_attention if kernel == "ring" else context_attention.halo_attention
        want[name] = outputs_and_grads(lambda q, k, v, s, w=window, c=causal: attention.xla_attention(
            q, k, v, s, w, causal=c))
        got[name] = outputs_and_grads(lambda q, k, v, s, f=split, w=window, c=causal: f(q, k, v, s, w, c))
    want = jax.jit(lambda *a: {name: f(*a) for name, f in want.items()})(q, k, v, segments)
    # Every case in one program (one compile): rows over data, heads over tensor, the sequence over context.
    mesh = make_mesh(ml_collections.ConfigDict(dict(shape=(2, 1, 2), context=4)))
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULE_PRESETS["fsdp_tp"]):
        got = jax.jit(lambda *a: {name: f(*a) for name, f in got.items()})(q, k, v, segments)
    out = {}
    for name in want:
        (want_out, want_grads), (got_out, got_grads) = want[name], got[name]
        out[name] = {"output": float(jnp.max(jnp.abs(got_out - want_out))),
                     **{f"d{x}": float(jnp.max(jnp.abs(a - b))) for x, a, b in zip("qkv", got_grads, want_grads)}}
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
