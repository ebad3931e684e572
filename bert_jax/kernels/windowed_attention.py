"""Flash attention with a bidirectional sliding window and packed segments, as Pallas GPU (Triton) kernels.

    o = softmax(scale * q k^T + mask) v,  mask: same segment, and |i - j| <= window when a window is given
                                          causal: j <= i too, and i - j <= window (the window looks back only)

The mask is `kernels.attention.allowed_keys`' (the xla reference's), applied per tile from [batch, length]
segment ids: no [batch, heads, q, k] tensor reaches HBM. Scores and probabilities live per tile in registers and
shared memory, with an online softmax in base 2 (Dao et al. 2022; jax's `pallas/ops/gpu/attention.py` is the
layout this follows); the statistics and every accumulator are float32 whatever the inputs' dtype.

Work skipped (the speed levers): a query block's loop runs over the key blocks from the first to the last that
hold a key one of its queries may meet: within the window (a local layer of window w costs about
(block_q + 2w) / length of a global one), and within the span of its queries' documents (`segment_spans`: in a
packed row the other documents' tiles, and the padding's, are never read). The bounds come from two int32 rows
computed once per call, so the loop body has no branch and Triton can pipeline its loads. The backward does the
same from both sides.

Backward: one kernel (grid batch x heads x blocks), as jax's op: program j accumulates dk, dv for key block j over
the query blocks in its window, then dq for query block j over its key blocks, both from the forward's log-sum-exp
(base 2) and delta = rowsum(o * do) (an XLA fusion); the scores are recomputed twice, the price of no atomics.

Shapes: q, k, v [batch, length, heads, head_dim] (the model's layout, read in place through strided blocks);
segments [batch, length] int32, -1 on padding (a segment of its own). A length that is not a multiple of the block
is padded with a segment (-2) no real token or padding meets; a head_dim that is not a power of two >= 16 (Triton's
smallest dot) is zero-padded; both are sliced off again. Block sizes are Triton's usual flash-attention tiles, not
autotuned (no GPU was at hand to tune them).
"""
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

LOG2E = math.log2(math.e)
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # finite: exp2(MASK - max) is 0, never NaN
PAD_SEGMENT = -2  # the length padding's segment: meets neither real tokens nor the batch's padding (-1)
MIN_DOT = 16  # Triton's smallest dot operand side


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tiles. Forward: a program holds `block_q` queries and loops over keys `block_k` at a time. Backward: program
    j holds `block_outer` keys (dk, dv) looping over queries `block_inner` at a time, then `block_outer` queries
    (dq) looping over keys `block_inner` at a time. All powers of two >= 16."""

    block_q: int = 128
    block_k: int = 64
    block_outer: int = 64
    block_inner: int = 32

    def fitted(self, length: int) -> "BlockSizes":
        """No tile longer than the (power-of-two rounded) sequence: a micro test's length is one tile."""
        cap = max(MIN_DOT, pl.next_power_of_2(length))
        return BlockSizes(*(min(b, cap) for b in dataclasses.astuple(self)))

    def check(self) -> None:
        for name, b in dataclasses.asdict(self).items():
            if b < MIN_DOT or b & (b - 1):
                raise ValueError(f"windowed attention {name}={b}: tiles are powers of two >= {MIN_DOT}")

    @property
    def multiple(self) -> int:
        return max(dataclasses.astuple(self))


def _dot(a, b, trans_a: bool = False, trans_b: bool = False):
    """a @ b (either side transposed) with a float32 accumulator, whatever the inputs' dtype."""
    dims = (((0,) if trans_a else (1,), (1,) if trans_b else (0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def segment_spans(segments: jax.Array) -> jax.Array:
    """[batch, 2, length] int32: the first and the last position of each token's segment. Packed rows hold each
    document (and the padding) as one run; a row whose ids are not whole runs gets the whole row (0, length - 1),
    so that the kernels' loop bounds stay correct for any ids, only wider."""
    b, length = segments.shape
    pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
    starts = jnp.concatenate([jnp.ones((b, 1), bool), segments[:, 1:] != segments[:, :-1]], axis=1)
    ends = jnp.concatenate([segments[:, :-1] != segments[:, 1:], jnp.ones((b, 1), bool)], axis=1)
    first = jax.lax.cummax(jnp.where(starts, pos, 0), axis=1)
    last = jax.lax.cummin(jnp.where(ends, pos, length - 1), axis=1, reverse=True)
    ordered = jnp.sort(segments, axis=1)
    distinct = 1 + jnp.sum(ordered[:, 1:] != ordered[:, :-1], axis=1)
    whole_runs = (jnp.sum(starts, axis=1) == distinct)[:, None]
    return jnp.stack([jnp.where(whole_runs, first, 0), jnp.where(whole_runs, last, length - 1)], axis=1)


def _block_range(spans_ref, start, block: int, other_block: int, window: int | None, num_other: int,
                 causal: bool = False, of_queries: bool = True):
    """[lo, hi): the other side's blocks that hold a key (`of_queries`: the positions in [start, start + block) are
    queries) or a query (they are keys) one of those positions may meet: within the span of its segments, and within
    `window` of it; causal, only keys at or before a query."""
    first = jnp.min(spans_ref[0, pl.ds(start, block)])
    last = jnp.max(spans_ref[1, pl.ds(start, block)])
    back, ahead = window, (0 if causal else window)  # how far a query's keys reach behind it, and ahead of it
    if not of_queries:
        back, ahead = ahead, back  # a key's queries: ahead of it as far as a query looks back
    if back is not None:
        first = jnp.maximum(first, start - back)
    if ahead is not None:
        last = jnp.minimum(last, start + block - 1 + ahead)
    return jax.lax.div(first, other_block), jnp.minimum(jax.lax.div(last, other_block) + 1, num_other)


def _allowed(seg_q, seg_k, q_start, k_start, window: int | None, causal: bool = False):
    """[queries, keys] bool: `allowed_keys` for one tile."""
    allowed = seg_q[:, None] == seg_k[None, :]
    if window is not None or causal:
        distance = (q_start + jnp.arange(seg_q.shape[0]))[:, None] - (k_start + jnp.arange(seg_k.shape[0]))[None, :]
        if causal:
            allowed = allowed & (distance >= 0)
        if window is not None:
            allowed = allowed & (distance <= window) & (distance >= (0 if causal else -window))
    return allowed


def _scores(q, k, seg_q, seg_k, q_start, k_start, scale, window, causal=False):
    """[queries, keys] float32 logits in base 2 (scale * log2 e folded in), masked."""
    s = _dot(q, k, trans_b=True) * (scale * LOG2E)
    return jnp.where(_allowed(seg_q, seg_k, q_start, k_start, window, causal), s, MASK_VALUE)


def _forward_kernel(q_ref, k_ref, v_ref, seg_ref, spans_ref, o_ref, lse_ref, *, scale, window, causal, block_q,
                    block_k):
    num_k = k_ref.shape[0] // block_k
    q_start = pl.program_id(0) * block_q
    q = q_ref[...]
    seg_q = seg_ref[pl.ds(q_start, block_q)]
    d = q.shape[-1]

    def body(kj, carry):
        o, m, l = carry
        k_start = kj * block_k
        seg_k = seg_ref[pl.ds(k_start, block_k)]
        s = _scores(q, k_ref[pl.ds(k_start, block_k), :], seg_q, seg_k, q_start, k_start, scale, window, causal)
        m_next = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp2(m - m_next)
        p = jnp.exp2(s - m_next[:, None])
        v = v_ref[pl.ds(k_start, block_k), :]
        return alpha[:, None] * o + _dot(p.astype(v.dtype), v), m_next, alpha * l + jnp.sum(p, axis=1)

    lo, hi = _block_range(spans_ref, q_start, block_q, block_k, window, num_k, causal)
    init = (jnp.zeros((block_q, d), jnp.float32), jnp.full((block_q,), -jnp.inf, jnp.float32),
            jnp.zeros((block_q,), jnp.float32))
    o, m, l = jax.lax.fori_loop(lo, hi, body, init)  # every query meets itself: l >= 1
    o_ref[...] = (o / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log2(l)


def _backward_kernel(q_ref, k_ref, v_ref, seg_ref, spans_ref, do_ref, lse_ref, delta_ref, dq_ref, dk_ref, dv_ref, *,
                     scale, window, causal, block_outer, block_inner):
    length = q_ref.shape[0]
    num_inner = length // block_inner
    start = pl.program_id(2) * block_outer
    seg_outer = seg_ref[pl.ds(start, block_outer)]
    d = q_ref.shape[-1]
    # The queries that meet this key block, and the keys this query block meets (the same blocks unless causal).
    q_lo, q_hi = _block_range(spans_ref, start, block_outer, block_inner, window, num_inner, causal, of_queries=False)
    k_lo, k_hi = _block_range(spans_ref, start, block_outer, block_inner, window, num_inner, causal)
    zeros = jnp.zeros((block_outer, d), jnp.float32)

    # dk, dv for keys [start, start + block_outer), over the query blocks that meet them.
    k, v = k_ref[pl.ds(start, block_outer), :], v_ref[pl.ds(start, block_outer), :]

    def over_queries(qi, carry):
        dk, dv = carry
        q_start = qi * block_inner
        rows = pl.ds(q_start, block_inner)
        q, do = q_ref[rows, :], do_ref[rows, :]
        s = _scores(q, k, seg_ref[rows], seg_outer, q_start, start, scale, window, causal)
        p = jnp.exp2(s - lse_ref[rows][:, None])
        dv = dv + _dot(p.astype(do.dtype), do, trans_a=True)
        ds = p * (_dot(do, v, trans_b=True) - delta_ref[rows][:, None]) * scale
        return dk + _dot(ds.astype(q.dtype), q, trans_a=True), dv

    dk, dv = jax.lax.fori_loop(q_lo, q_hi, over_queries, (zeros, zeros))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)

    # dq for queries [start, start + block_outer), over the key blocks they meet.
    rows = pl.ds(start, block_outer)
    q, do = q_ref[rows, :], do_ref[rows, :]
    lse, delta = lse_ref[rows][:, None], delta_ref[rows][:, None]

    def over_keys(kj, dq):
        k_start = kj * block_inner
        cols = pl.ds(k_start, block_inner)
        k_tile = k_ref[cols, :]
        p = jnp.exp2(_scores(q, k_tile, seg_outer, seg_ref[cols], start, k_start, scale, window, causal) - lse)
        ds = p * (_dot(do, v_ref[cols, :], trans_b=True) - delta) * scale
        return dq + _dot(ds.astype(k_tile.dtype), k_tile)

    dq_ref[...] = jax.lax.fori_loop(k_lo, k_hi, over_keys, zeros).astype(dq_ref.dtype)


def _compiler_params(head_dim: int, num_stages: int):
    from jax.experimental.pallas import triton as plgpu  # the Triton backend's parameters only; no GPU needed

    return plgpu.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=num_stages)


def _forward(q, k, v, segments, spans, scale, window, causal, blocks: BlockSizes, interpret: bool):
    b, length, h, d = q.shape
    tile = lambda rows, index: pl.BlockSpec((None, rows, None, d), index)  # noqa: E731  [b, L, h, d] strided
    whole = tile(length, lambda i, j, n: (j, 0, n, 0))
    o, lse = pl.pallas_call(
        functools.partial(_forward_kernel, scale=scale, window=window, causal=causal, block_q=blocks.block_q,
                          block_k=blocks.block_k),
        grid=(length // blocks.block_q, b, h),
        in_specs=[tile(blocks.block_q, lambda i, j, n: (j, i, n, 0)), whole, whole,
                  pl.BlockSpec((None, length), lambda i, j, n: (j, 0)),
                  pl.BlockSpec((None, 2, length), lambda i, j, n: (j, 0, 0))],
        out_specs=[tile(blocks.block_q, lambda i, j, n: (j, i, n, 0)),
                   pl.BlockSpec((None, None, blocks.block_q), lambda i, j, n: (j, n, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, length), jnp.float32)],
        compiler_params=None if interpret else _compiler_params(d, num_stages=2),
        interpret=interpret,
        name="windowed_attention_fwd",
    )(q, k, v, segments, spans)
    return o, lse


def _backward(q, k, v, segments, spans, o, lse, do, scale, window, causal, blocks: BlockSizes, interpret: bool):
    b, length, h, d = q.shape
    delta = jnp.einsum("blhd,blhd->bhl", o.astype(jnp.float32), do.astype(jnp.float32))
    whole = pl.BlockSpec((None, length, None, d), lambda i, n, j: (i, 0, n, 0))
    stat = pl.BlockSpec((None, None, length), lambda i, n, j: (i, n, 0))
    out = pl.BlockSpec((None, blocks.block_outer, None, d), lambda i, n, j: (i, j, n, 0))
    return pl.pallas_call(
        functools.partial(_backward_kernel, scale=scale, window=window, causal=causal,
                          block_outer=blocks.block_outer, block_inner=blocks.block_inner),
        grid=(b, h, length // blocks.block_outer),
        in_specs=[whole, whole, whole, pl.BlockSpec((None, length), lambda i, n, j: (i, 0)),
                  pl.BlockSpec((None, 2, length), lambda i, n, j: (i, 0, 0)), whole, stat, stat],
        out_specs=[out, out, out],
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v)],
        compiler_params=None if interpret else _compiler_params(d, num_stages=2),
        interpret=interpret,
        name="windowed_attention_bwd",
    )(q, k, v, segments, spans, do, lse, delta)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def _attention(q, k, v, segments, spans, scale: float, window: int | None, causal: bool, blocks: BlockSizes,
               interpret: bool):
    return _forward(q, k, v, segments, spans, scale, window, causal, blocks, interpret)[0]


def _vjp_forward(q, k, v, segments, spans, scale, window, causal, blocks, interpret):
    o, lse = _forward(q, k, v, segments, spans, scale, window, causal, blocks, interpret)
    return o, (q, k, v, segments, spans, o, lse)


def _vjp_backward(scale, window, causal, blocks, interpret, residuals, do):
    q, k, v, segments, spans, o, lse = residuals
    dq, dk, dv = _backward(q, k, v, segments, spans, o, lse, do, scale, window, causal, blocks, interpret)
    return dq, dk, dv, None, None


_attention.defvjp(_vjp_forward, _vjp_backward)


def windowed_attention(q, k, v, segments, window: int | None, scale: float, interpret: bool = False,
                       blocks: BlockSizes = BlockSizes(), causal: bool = False) -> jax.Array:
    """softmax(scale * q k^T + mask) v with `allowed_keys(segments, window)`'s mask. q, k, v: [batch, length,
    heads, head_dim] (any float dtype; bf16 is what it is for), segments [batch, length] int32 (-1 padding) ->
    [batch, length, heads, head_dim] in q's dtype. `scale` is the caller's (1 / sqrt(head_dim) in standard
    parametrization): the kernel never derives it. `interpret`: Pallas interpret mode (tests on a CPU). `causal`:
    keys at or before the query only, `window` of them back (a causal objective's); the tiles above the diagonal are
    never visited."""
    if window is not None and window < 0:
        raise ValueError(f"windowed attention: window={window} must be >= 0 (tokens either side) or None")
    blocks.check()
    length, d = q.shape[1], q.shape[-1]
    blocks = blocks.fitted(length)
    padded_length = -(-length // blocks.multiple) * blocks.multiple
    padded_d = max(MIN_DOT, pl.next_power_of_2(d))
    if (padded_length, padded_d) != (length, d):
        pad = lambda x: jnp.pad(x, ((0, 0), (0, padded_length - length), (0, 0), (0, padded_d - d)))  # noqa: E731
        q, k, v = pad(q), pad(k), pad(v)
        segments = jnp.pad(segments, ((0, 0), (0, padded_length - length)), constant_values=PAD_SEGMENT)
    segments = segments.astype(jnp.int32)
    out = _attention(q, k, v, segments, segment_spans(segments), float(scale), window, bool(causal), blocks,
                     interpret)
    return out[:, :length, :, :d]
