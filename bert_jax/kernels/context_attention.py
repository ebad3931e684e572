"""Attention over a sequence split along the context mesh axis, without gathering it: a ring for global layers, a
halo exchange for windowed ones (config.mesh.context_attention, docs/guides/long-context.md).

Both run in `jax.shard_map` over the whole mesh: each device holds its rows (the logical `batch` axis), its heads
(`heads`) and its slice of the sequence (`length`, on the context axis), and talks only along the context axis with
`jax.lax.ppermute`. Masks are xla_attention's (kernels/attention.py), from the segment ids that travel with the keys
and from positions in the row, which each device derives from its place on the axis.

    ring  (global layers, config.mesh.context_attention='ring') every device keeps its queries and passes its keys,
          values and their segment ids to the next device, N-1 hops; each hop's scores are merged into a running
          maximum and sum in float32 (the online softmax of Milakov & Gimelshein 2018, as flash attention and Liu et
          al. 2023's ring attention do). The backward passes the blocks round once more with their gradients, so a
          device never holds more than its own block and one visiting block: no [length] keys anywhere.
    halo  (windowed layers, either scheme, when the window fits in a shard) a device needs only the `window` keys
          either side of its slice: one permute from each neighbour, the sequence's two ends padded with a segment
          id that matches nothing.

Each device's queries go a chunk at a time (attention.query_chunk), so it holds one chunk's scores against one block.
"""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.kernels.attention import allowed_between, query_chunk, softmax_saving_probs_in, splash_rows

SCHEMES = ("all_gather", "ring")  # config.mesh.context_attention
_NEG = float(np.finfo(np.float32).min)
_NOWHERE = -2  # the segment id of the keys past the sequence's ends: padding is -1, documents >= 0


def _on_context_axis(run, q, k, v, segments, **static):
    """run(q, k, v, segments, axis=, shards=, **static) on each device's rows, heads and slice of the sequence; the
    mesh axes that split `length` are passed as `axis`, their size as `shards`."""
    mesh = jax.sharding.get_abstract_mesh()
    spec = nn.logical_to_mesh_axes(("batch", "length", "heads", "kv"))
    axis = spec[1] if isinstance(spec[1], tuple) else (spec[1],)
    shards = int(np.prod([mesh.shape[a] for a in axis]))
    body = functools.partial(run, axis=axis, shards=shards, **static)
    return jax.shard_map(body, mesh=mesh, in_specs=(spec, spec, spec, jax.P(spec[0], spec[1])), out_specs=spec,
                         check_vma=False)(q, k, v, segments)


def _chunks(x: jax.Array, m: int) -> jax.Array:
    """[batch, length, ...] -> [length / m, batch, m, ...]."""
    return jnp.moveaxis(x.reshape(x.shape[0], x.shape[1] // m, m, *x.shape[2:]), 1, 0)


def _unchunk(x: jax.Array) -> jax.Array:
    """The inverse of _chunks."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


# --- ring: global layers ------------------------------------------------------------------------------------------


def ring_attention(q, k, v, segments, window: int | None = None, causal: bool = False) -> jax.Array:
    """xla_attention (no dropout, no score bias) for q, k, v [batch, length, heads, head_dim] and segments [batch,
    length] split along `length` over the context axis, by a ring of permutes (see the module's docstring)."""
    return _on_context_axis(_ring_shard, q, k, v, segments, window=window, causal=causal)


def _ring_shard(q, k, v, segments, *, axis, shards, window, causal):
    return _ring(q, k, v, segments, axis, shards, window, causal)


def _to_next(axis, shards, *xs):
    """Each device's `xs` sent to the next one along the ring."""
    perm = [(i, (i + 1) % shards) for i in range(shards)]
    return tuple(jax.lax.ppermute(x, axis, perm) for x in xs)


def _hop_positions(axis, shards, hop, s):
    """Row positions [s] of the block a device holds after `hop` hops: it came from `hop` devices back."""
    source = (jax.lax.axis_index(axis) - hop) % shards
    return source * s + jnp.arange(s)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _ring(q, k, v, segments, axis, shards, window, causal):
    return _ring_fwd(q, k, v, segments, axis, shards, window, causal)[0]


def _ring_fwd(q, k, v, segments, axis, shards, window, causal):
    b, s, h, d = q.shape
    m = query_chunk(s, s, b * h)  # each hop: a chunk's queries against one block of s keys
    scale = 1.0 / np.sqrt(d)
    qc, q_segments = _chunks(q, m), _chunks(segments, m)  # [n, b, m, ...]
    q_positions = _hop_positions(axis, shards, 0, s).reshape(-1, m)  # [n, m]

    def merge(stats, block, hop):
        """The running (output [n, b, h, m, d], maximum, sum [n, b, h, m]) with one block's scores merged in."""
        kb, vb, kseg = block
        k_positions = _hop_positions(axis, shards, hop, s)

        def one_chunk(args):
            qx, qseg, qpos, out, top, total = args
            logits = jnp.einsum("bqhd,bkhd->bhqk", qx, kb, preferred_element_type=jnp.float32) * scale
            logits = jnp.where(allowed_between(qseg, kseg, qpos, k_positions, window, causal), logits, _NEG)
            new_top = jnp.maximum(top, jnp.max(logits, axis=-1))
            fade = jnp.exp(top - new_top)  # what the earlier blocks' terms are worth under the new maximum
            probs = jnp.exp(logits - new_top[..., None])
            total = total * fade + jnp.sum(probs, axis=-1)
            out = out * fade[..., None] + jnp.einsum("bhqk,bkhd->bhqd", probs.astype(vb.dtype), vb,
                                                     preferred_element_type=jnp.float32)
            return out, new_top, total

        return jax.lax.map(one_chunk, (qc, q_segments, q_positions, *stats))

    n = s // m
    stats = (jnp.zeros((n, b, h, m, d), jnp.float32), jnp.full((n, b, h, m), _NEG, jnp.float32),
             jnp.zeros((n, b, h, m), jnp.float32))

    def hop(carry, step):
        stats, block = carry
        visiting = _to_next(axis, shards, *block)  # sent before this hop's compute, so the two can overlap
        return (merge(stats, block, step), visiting), None

    # Hops 0 .. N-2 each pass their block on; the last one keeps it: N-1 permutes.
    (stats, block), _ = jax.lax.scan(hop, (stats, (k, v, segments)), jnp.arange(shards - 1))
    out, top, total = merge(stats, block, shards - 1)
    lse = top + jnp.log(total)  # [n, b, h, m]
    out = _unchunk(jnp.swapaxes(out / total[..., None], 2, 3)).astype(q.dtype)  # [b, s, h, d]
    return out, (q, k, v, segments, out, lse)


def _ring_bwd(axis, shards, window, causal, residuals, g):
    q, k, v, segments, out, lse = residuals
    b, s, h, d = q.shape
    m = query_chunk(s, s, b * h)  # each hop: a chunk's queries against one block of s keys
    scale = 1.0 / np.sqrt(d)
    qc, q_segments, gc = _chunks(q, m), _chunks(segments, m), _chunks(g.astype(q.dtype), m)
    q_positions = _hop_positions(axis, shards, 0, s).reshape(-1, m)
    # sum_k p dp = sum_d out g per query: [n, b, h, m]
    delta = jnp.swapaxes(_chunks(jnp.sum(out.astype(jnp.float32) * g.astype(jnp.float32), axis=-1), m), 2, 3)

    def grads(block, hop):
        """(dq [n, b, m, h, d], dk, dv [b, s, h, d]) of every query chunk against one block, float32."""
        kb, vb, kseg = block
        k_positions = _hop_positions(axis, shards, hop, s)

        def one_chunk(acc, args):
            qx, qseg, qpos, gx, lse_c, delta_c = args
            logits = jnp.einsum("bqhd,bkhd->bhqk", qx, kb, preferred_element_type=jnp.float32) * scale
            allowed = allowed_between(qseg, kseg, qpos, k_positions, window, causal)
            probs = jnp.where(allowed, jnp.exp(logits - lse_c[..., None]), 0.0)
            dv = jnp.einsum("bhqk,bqhd->bkhd", probs.astype(q.dtype), gx, preferred_element_type=jnp.float32)
            dprobs = jnp.einsum("bqhd,bkhd->bhqk", gx, vb, preferred_element_type=jnp.float32)
            dlogits = (probs * (dprobs - delta_c[..., None]) * scale).astype(q.dtype)
            dq = jnp.einsum("bhqk,bkhd->bqhd", dlogits, kb, preferred_element_type=jnp.float32)
            dk = jnp.einsum("bhqk,bqhd->bkhd", dlogits, qx, preferred_element_type=jnp.float32)
            return (acc[0] + dk, acc[1] + dv), dq

        zeros = jnp.zeros((b, s, h, d), jnp.float32)
        (dk, dv), dq = jax.lax.scan(one_chunk, (zeros, zeros), (qc, q_segments, q_positions, gc, lse, delta))
        return dq, dk, dv

    def hop(carry, step):
        dq, block, dk, dv = carry
        visiting = _to_next(axis, shards, *block)
        dq_block, dk_block, dv_block = grads(block, step)
        # The block's gradients travel with it, so they arrive home after the last hop's permute.
        dk, dv = _to_next(axis, shards, dk + dk_block, dv + dv_block)
        return (dq + dq_block, visiting, dk, dv), None

    zeros = jnp.zeros((b, s, h, d), jnp.float32)
    start = (jnp.zeros((s // m, b, m, h, d), jnp.float32), (k, v, segments), zeros, zeros)
    (dq, block, dk, dv), _ = jax.lax.scan(hop, start, jnp.arange(shards - 1))
    dq_block, dk_block, dv_block = grads(block, shards - 1)
    dk, dv = _to_next(axis, shards, dk + dk_block, dv + dv_block)
    return _unchunk(dq + dq_block).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_ring.defvjp(_ring_fwd, _ring_bwd)


# --- splash over the gathered keys: global layers, all_gather scheme, attention_impl='splash' ----------------------


def splash_over_gathered(q, k, v, segments, interpret: bool) -> jax.Array:
    """Splash (bidirectional, no window) for q, k, v [batch, length, heads, head_dim] and segments [batch, length]
    split along `length` over the context axis: each device all-gathers the keys, values and their segment ids over
    the axis and runs the flash kernel on its own queries against all of them; the backward reduce-scatters the keys'
    and values' gradients (the all-gather's transpose). No device holds a [queries, keys] score matrix, as the
    chunked xla kernel does in HBM."""
    return _on_context_axis(_splash_shard, q, k, v, segments, interpret=interpret)


def _splash_shard(q, k, v, segments, *, axis, shards, interpret):
    del shards
    k, v, kv_segments = (jax.lax.all_gather(x, axis, axis=1, tiled=True) for x in (k, v, segments))
    return splash_rows(q, k, v, segments, kv_segments, None, interpret)


# --- halo: windowed layers ----------------------------------------------------------------------------------------


def halo_fits(window: int | None, length: int, shards: int) -> bool:
    """Whether a windowed layer's keys come from the neighbours alone: a window of one token up to one shard."""
    return window is not None and 0 < window <= length // shards


def halo_attention(q, k, v, segments, window: int, causal: bool = False) -> jax.Array:
    """xla_attention (no dropout, no score bias) with a window of at most a shard's length, for q, k, v [batch,
    length, heads, head_dim] and segments [batch, length] split along `length` over the context axis: each device
    gets `window` keys from either neighbour (from the left one only when causal), never the whole sequence."""
    return _on_context_axis(_halo_shard, q, k, v, segments, window=window, causal=causal)


def _halo_shard(q, k, v, segments, *, axis, shards, window, causal):
    b, s, h, d = q.shape
    index = jax.lax.axis_index(axis)
    rightward = [(i, i + 1) for i in range(shards - 1)]  # a device's tail becomes its right neighbour's left halo
    leftward = [(i + 1, i) for i in range(shards - 1)]
    left = [jax.lax.ppermute(x[:, s - window:], axis, rightward) for x in (k, v, segments)]
    left[2] = jnp.where(index == 0, _NOWHERE, left[2])  # before the first token: nothing to see
    parts = [left, (k, v, segments)]
    right_width = 0 if causal else window  # a causal query sees no key after it: no right halo
    if right_width:
        right = [jax.lax.ppermute(x[:, :window], axis, leftward) for x in (k, v, segments)]
        right[2] = jnp.where(index == shards - 1, _NOWHERE, right[2])
        parts.append(right)
    k_ext, v_ext, seg_ext = (jnp.concatenate(xs, axis=1) for xs in zip(*parts))
    m = query_chunk(s)
    span = m + window + right_width  # the keys a chunk of m queries can see
    scale = 1.0 / np.sqrt(d)

    @jax.checkpoint
    def one_chunk(args):
        i, qx, qseg = args
        start = i * m  # in k_ext, the key `window` places left of the chunk's first query
        kx, vx = (jax.lax.dynamic_slice_in_dim(x, start, span, axis=1) for x in (k_ext, v_ext))
        kseg = jax.lax.dynamic_slice_in_dim(seg_ext, start, span, axis=1)
        q_positions = index * s + start + jnp.arange(m)
        k_positions = index * s + start - window + jnp.arange(span)
        logits = jnp.einsum("bqhd,bkhd->bhqk", qx, kx, preferred_element_type=jnp.float32) * scale
        allowed = allowed_between(qseg, kseg, q_positions, k_positions, window, causal)
        logits = logits + jnp.where(allowed, 0.0, _NEG)  # as xla_attention adds its mask
        probs = softmax_saving_probs_in(logits, q.dtype)
        return jnp.einsum("bhqk,bkhd->bqhd", probs, vx)

    out = jax.lax.map(one_chunk, (jnp.arange(s // m), _chunks(q, m), _chunks(segments, m)))
    return _unchunk(out)
