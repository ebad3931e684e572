"""DeBERTa's disentangled attention as one fused Pallas TPU kernel, forward and backward (`jax.custom_vjp`).

    s[i, j] = scale * (q_i . k_j + q_i . Kr[idx(i - j)] + k_j . Qr[idx(i - j)]),  o = softmax(s + mask) v

No [batch, heads, q, k] tensor reaches HBM: scores, probabilities and both position terms live per
[block, block] tile in VMEM, with an online softmax (as flash attention, Dao et al. 2022), and the
backward recomputes them once from the saved log-sum-exp, in one kernel over key-major tiles that keeps dq for the
whole sequence in VMEM (one [L, head_dim] float32 buffer per row and head).

The position terms, per tile. A tile (query block qi, key block ki, both `block` long) sees the
2 * block - 1 distances d = (qi - ki) * block + i - j. The relative tables arrive "by distance": row m of
`table_k` is Kr[idx(m - L + 1)], m in [0, 2L) (gathered once per layer by XLA, [heads, 2L, head_dim]), so
the tile's distances are the 2 * block consecutive rows from m0 = (L / block - 1 + qi - ki) * block.
One matmul of the query block against those rows gives P[i, v] = q_i . Kr[idx(d)] with v = i - j +
block - 1, and c2p[i, j] = P[i, v(i, j)] is a gather along lanes, one lane-vreg at a time (Mosaic's
dynamic gather takes indices within one 128-lane vreg, so P is read as its two halves, v < block and
v >= block). p2c is the same with the key block against `table_q`, in key-major layout, then transposed.
This is FlashDeBERTa's idea (per-block projections against the span of relative rows) in TPU form.
The backward scatters dS back onto the span by the inverse gather (the "relative shift" trick with a
roll needs a negative stride there, which Mosaic refuses) and accumulates the tables' gradients per
head in VMEM across the batch and the tiles.

Masks: padding and packed segments as [batch, length] ids (padding a segment of its own, as the other
kernels take them).

Dropout of the probabilities (DeBERTa's recipe: 0.1) happens in the tiles too. Its bits are a counter-based
hash of (key of the row and head, query position, key position), as FlashAttention draws them from Philox
counters: each kernel recomputes exactly the forward's mask for any tiling and grid order, nothing is stored,
and a sharded run draws the mask of one device (the keys are of global rows and heads). The keys come from the
layer's `dropout` rng: reproducible from the step's key.

Shapes: q, k, v [batch, heads, L, head_dim]; tables [heads, 2L, head_dim]; segments [batch, L] int32.
On TPU the block is 128 (L a multiple of 128); in interpret mode (tests on a CPU) a power-of-two L up
to 128 is one block.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

NUM_LANES = 128
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # finite: exp(MASK - max) is 0, never NaN


def block_size(length: int, interpret: bool, block: int | None = None) -> int:
    """128 on TPU (one lane-vreg: the in-kernel gathers read one); in interpret mode a short power-of-two
    length is one block, or `block` (a power of two dividing the length: tests of the tiling)."""
    if block is not None:
        if not (interpret and length % block == 0 and block & (block - 1) == 0):
            raise ValueError(f"block={block}: only in interpret mode, a power of two dividing the length {length}")
        return block
    if length % NUM_LANES == 0:
        return NUM_LANES
    if interpret and length < NUM_LANES and length & (length - 1) == 0:
        return length
    raise ValueError(
        f"the fused disentangled-attention kernel needs a sequence length that is a multiple of 128 "
        f"(config.data.max_seq_length); got {length}. Use config.model.attention_impl='xla', or pad the length.")


def _dot(a, b, trans_a=False, trans_b=False):
    dims = (((0,) if trans_a else (1,), (1,) if trans_b else (0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def _int32(value: int) -> np.int32:
    return np.uint32(value).view(np.int32)


def mix32(x: jax.Array) -> jax.Array:
    """int32 bit patterns in, 32 mixed bits out: Wellons' lowbias32 integer hash (xor-shift-multiply, wrapping)
    in the vector units' int32 arithmetic, which Mosaic lowers and interpret mode runs alike."""
    x = x ^ jax.lax.shift_right_logical(x, 16)
    x = x * _int32(0x7FEB352D)
    x = x ^ jax.lax.shift_right_logical(x, 15)
    x = x * _int32(0x846CA68B)
    return x ^ jax.lax.shift_right_logical(x, 16)


def dropout_keys(seed: jax.Array, batch: int, heads: int, batch_offset=0, head_offset=0) -> jax.Array:
    """[batch * heads] int32: one key per row and head, from `seed` [2] int32 (the layer's dropout rng) and the
    rows' and heads' global indices (offsets: a shard's first row and head)."""
    b = jnp.arange(batch, dtype=jnp.int32) + jnp.asarray(batch_offset, jnp.int32)
    h = jnp.arange(heads, dtype=jnp.int32) + jnp.asarray(head_offset, jnp.int32)
    row = mix32(mix32(b ^ seed[0]) + seed[1])
    return mix32(row[:, None] ^ mix32(h * _int32(0x9E3779B9) + seed[1])[None, :]).reshape(-1)


def dropout_threshold(rate: float) -> int:
    """A probability is dropped where the hash's top 24 bits fall below this: P(drop) = rate to within 2^-24."""
    return int(round(rate * (1 << 24)))


def kept(key, queries, keys, length: int, threshold: int) -> jax.Array:
    """bool, the shape of `queries` / `keys` (int32 positions): True where probability (query, key) is kept."""
    x = mix32((queries * length + keys) ^ key)
    return jax.lax.shift_right_logical(mix32(x + key), 8) >= threshold


def dropout_mask(keys: jax.Array, batch: int, heads: int, length: int, rate: float) -> jax.Array:
    """[batch, heads, L, L] bool: the kernel's kept probabilities, whole (for tests and references)."""
    i = jnp.arange(length, dtype=jnp.int32)[:, None]
    j = jnp.arange(length, dtype=jnp.int32)[None, :]
    return jax.vmap(lambda key: kept(key, i, j, length, dropout_threshold(rate)))(keys).reshape(
        batch, heads, length, length)


def _tile_kept(keys_ref, b, h, heads: int, q_start, k_start, block: int, length: int, rate: float,
               query_major: bool):
    """The tile's kept mask: [i, j] query-major, [j, i] key-major."""
    r, c = _iotas(block)
    queries, keys = (q_start + r, k_start + c) if query_major else (q_start + c, k_start + r)
    return kept(keys_ref[b * heads + h], queries, keys, length, dropout_threshold(rate))


def _iotas(block: int):
    return (jax.lax.broadcasted_iota(jnp.int32, (block, block), 0),
            jax.lax.broadcasted_iota(jnp.int32, (block, block), 1))


def _take_lanes(x, index):
    return jnp.take_along_axis(x, index, axis=1, mode="promise_in_bounds")


def _gather_by_distance(p, rows_are_queries: bool):
    """p: [block, 2 * block] dot products of the block's rows with the tile's relative rows, column v =
    i - j + block - 1. Returns [rows, cols] = p[r, v(r, c)]: c2p [i, j] for query rows, p2c^T [j, i] for key
    rows."""
    block = p.shape[0]
    r, c = _iotas(block)
    i, j = (r, c) if rows_are_queries else (c, r)
    index = (i - j - 1) & (block - 1)  # v mod block (block is a power of two)
    return jnp.where(i <= j, _take_lanes(p[:, :block], index), _take_lanes(p[:, block:], index))


def _scatter_by_distance(dz, rows_are_queries: bool):
    """The transpose of _gather_by_distance: dz [rows, cols] -> its two halves over v, each [rows, block]."""
    block = dz.shape[0]
    r, v = _iotas(block)
    if rows_are_queries:  # row i, v = i - j + block - 1 -> j = (i - 1 - v) mod block; the first half when i <= v
        gathered = _take_lanes(dz, (r - 1 - v) & (block - 1))
        first = r <= v
    else:  # row j, column i = v + j - block + 1 -> (v + j + 1) mod block; the first half when v + j + 1 >= block
        gathered = _take_lanes(dz, (v + r + 1) & (block - 1))
        first = v + r + 1 >= block
    low = jnp.where(first, gathered, 0.0)
    return low, gathered - low


def _span_start(length: int, block: int, qi, ki):
    """Row of the distance tables where tile (qi, ki)'s 2 * block distances begin."""
    return pl.multiple_of((length // block - 1 + qi - ki) * block, block)


def _scores_query_major(q, k, tk_span, tq_span, scale):
    """[i, j] float32: scale * (q k^T + c2p + p2c)."""
    qk = _dot(q, k, trans_b=True)
    c2p = _gather_by_distance(_dot(q, tk_span, trans_b=True), rows_are_queries=True)
    p2c_t = _gather_by_distance(_dot(k, tq_span, trans_b=True), rows_are_queries=False)
    return (qk + c2p + p2c_t.T) * scale


def _column(row, block: int):
    """[1, block] along the lanes -> [block, block] whose row r holds row[r] everywhere (a sublane broadcast and
    one transpose): per-query statistics and ids reach HBM as rows of 4 bytes a token, not 128-lane columns."""
    return jnp.broadcast_to(row, (block, block)).T


def _split_keys(refs, rate: float):
    """Kernel refs after the seven inputs: (the dropout keys' ref, or None without dropout; the rest)."""
    return (refs[0], refs[1:]) if rate else (None, refs)


def _forward_kernel(q_ref, k_ref, v_ref, tk_ref, tq_ref, seg_q_ref, seg_k_ref, *refs, scale, length, block, heads,
                    rate):
    keys_ref, (o_ref, lse_ref, m_scratch, l_scratch, acc_scratch, seg_scratch) = _split_keys(refs, rate)
    b, h, qi, ki = (pl.program_id(axis) for axis in range(4))

    @pl.when(ki == 0)
    def _init():
        m_scratch[...] = jnp.full(m_scratch.shape, -jnp.inf, jnp.float32)
        l_scratch[...] = jnp.zeros(l_scratch.shape, jnp.float32)
        acc_scratch[...] = jnp.zeros(acc_scratch.shape, jnp.float32)
        seg_scratch[...] = _column(seg_q_ref[...], block)

    m0 = _span_start(length, block, qi, ki)
    s = _scores_query_major(q_ref[...], k_ref[...], tk_ref[pl.ds(m0, 2 * block), :],
                            tq_ref[pl.ds(m0, 2 * block), :], scale)
    s = jnp.where(seg_scratch[...] == seg_k_ref[...], s, MASK_VALUE)
    m_prev, l_prev = m_scratch[...], l_scratch[...]  # [block, block], equal along lanes
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    p = jnp.exp(s - m_next)
    alpha = jnp.exp(m_prev - m_next)
    l_scratch[...] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
    m_scratch[...] = m_next
    if rate:  # the softmax's sum counts every probability; the context only the kept ones (1 / (1 - rate) at the end)
        p = jnp.where(_tile_kept(keys_ref, b, h, heads, qi * block, ki * block, block, length, rate, True), p, 0.0)
    acc_scratch[...] = acc_scratch[...] * alpha[:, :1] + _dot(p.astype(v_ref.dtype), v_ref[...])

    @pl.when(ki == pl.num_programs(3) - 1)
    def _finish():
        l = l_scratch[...]
        o_ref[...] = (acc_scratch[...] / (l[:, :1] * (1.0 - rate) if rate else l[:, :1])).astype(o_ref.dtype)
        lse_ref[...] = (m_scratch[...] + jnp.log(l)).T[:1, :]  # equal along lanes: its transpose's row 0


def _backward_kernel(q_ref, k_ref, v_ref, tk_ref, tq_ref, seg_q_ref, seg_k_ref, *refs, scale, length, block, heads,
                     rate):
    """Grid (heads, batch, k blocks, q blocks), key-major tiles [j, i]; one pass over the tiles for every gradient,
    so the scores are recomputed once: dk, dv per key block (written as the key block ends); dq for the whole
    sequence in VMEM ([L, head_dim] float32, written as the row ends); both tables' gradients per head, summed over
    the batch in their output blocks."""
    keys_ref, refs = _split_keys(refs, rate)
    (do_ref, lse_ref, delta_ref, dq_ref, dk_ref, dv_ref, dtk_ref, dtq_ref,
     dq_scratch, dk_scratch, dv_scratch, seg_scratch) = refs
    h, b, ki, qi = (pl.program_id(axis) for axis in range(4))

    @pl.when((b == 0) & (ki == 0) & (qi == 0))
    def _init_tables():
        dtk_ref[...] = jnp.zeros(dtk_ref.shape, jnp.float32)
        dtq_ref[...] = jnp.zeros(dtq_ref.shape, jnp.float32)

    @pl.when((ki == 0) & (qi == 0))
    def _init_row():
        dq_scratch[...] = jnp.zeros(dq_scratch.shape, jnp.float32)

    @pl.when(qi == 0)
    def _init_key_block():
        dk_scratch[...] = jnp.zeros(dk_scratch.shape, jnp.float32)
        dv_scratch[...] = jnp.zeros(dv_scratch.shape, jnp.float32)
        seg_scratch[...] = _column(seg_k_ref[...], block)

    m0 = _span_start(length, block, qi, ki)
    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
    tk_span, tq_span = tk_ref[pl.ds(m0, 2 * block), :], tq_ref[pl.ds(m0, 2 * block), :]
    c2p = _gather_by_distance(_dot(q, tk_span, trans_b=True), rows_are_queries=True)
    p2c_t = _gather_by_distance(_dot(k, tq_span, trans_b=True), rows_are_queries=False)
    s_t = (_dot(k, q, trans_b=True) + c2p.T + p2c_t) * scale  # [j, i]
    s_t = jnp.where(seg_scratch[...] == seg_q_ref[...], s_t, MASK_VALUE)
    p_t = jnp.exp(s_t - lse_ref[...])  # lse, delta: [1, block] along the query lanes
    dp_t = _dot(v, do, trans_b=True)
    if rate:  # the gradient reaches a probability through its kept, rescaled copy only
        kept_here = _tile_kept(keys_ref, b, h, heads, qi * block, ki * block, block, length, rate, False)
        dv_scratch[...] += _dot(jnp.where(kept_here, p_t * (1.0 / (1.0 - rate)), 0.0).astype(do.dtype), do)
        dp_t = jnp.where(kept_here, dp_t * (1.0 / (1.0 - rate)), 0.0)
    else:
        dv_scratch[...] += _dot(p_t.astype(do.dtype), do)
    dz_t = p_t * (dp_t - delta_ref[...]) * scale  # the gradient of the unscaled sum of the three terms, [j, i]

    # Keys: q k^T's and p2c's (the key block against its span of table_q).
    low, high = (x.astype(k.dtype) for x in _scatter_by_distance(dz_t, rows_are_queries=False))
    dk_scratch[...] += (_dot(dz_t.astype(q.dtype), q) + _dot(low, tq_span[:block]) + _dot(high, tq_span[block:]))
    dtq_ref[pl.ds(m0, block), :] += _dot(low, k, trans_a=True)
    dtq_ref[pl.ds(m0 + block, block), :] += _dot(high, k, trans_a=True)
    # Queries: q k^T's and c2p's (the query block against its span of table_k), query-major.
    dz = dz_t.T
    low, high = (x.astype(q.dtype) for x in _scatter_by_distance(dz, rows_are_queries=True))
    rows = pl.ds(pl.multiple_of(qi * block, block), block)
    dq_scratch[rows, :] += (_dot(dz.astype(k.dtype), k) + _dot(low, tk_span[:block]) + _dot(high, tk_span[block:]))
    dtk_ref[pl.ds(m0, block), :] += _dot(low, q, trans_a=True)
    dtk_ref[pl.ds(m0 + block, block), :] += _dot(high, q, trans_a=True)

    @pl.when(qi == pl.num_programs(3) - 1)
    def _finish_key_block():
        dk_ref[...] = dk_scratch[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_scratch[...].astype(dv_ref.dtype)

    @pl.when((ki == pl.num_programs(2) - 1) & (qi == pl.num_programs(3) - 1))
    def _finish_row():
        dq_ref[...] = dq_scratch[...].astype(dq_ref.dtype)


def _with_keys(specs: list, operands: tuple, keys, rate: float):
    """The kernels' inputs with the dropout keys (whole, in SMEM: one scalar read per tile) where rate > 0."""
    if not rate:
        return specs, operands
    return specs + [pl.BlockSpec(memory_space=pltpu.SMEM)], operands + (keys,)


def _forward(q, k, v, table_k, table_q, segments, keys, scale, interpret, block=None, rate=0.0):
    b, h, length, d = q.shape
    block = block_size(length, interpret, block)
    n = length // block
    spec = lambda index: pl.BlockSpec((None, None, block, d), index)  # noqa: E731
    table = pl.BlockSpec((None, 2 * length, d), lambda b, h, i, j: (h, 0, 0))
    ids = lambda index: pl.BlockSpec((None, 1, block), index)  # noqa: E731
    in_specs, operands = _with_keys(
        [spec(lambda b, h, i, j: (b, h, i, 0)), spec(lambda b, h, i, j: (b, h, j, 0)),
         spec(lambda b, h, i, j: (b, h, j, 0)), table, table,
         ids(lambda b, h, i, j: (b, 0, i)), ids(lambda b, h, i, j: (b, 0, j))],
        (q, k, v, table_k, table_q, segments[:, None, :], segments[:, None, :]), keys, rate)
    o, lse = pl.pallas_call(
        functools.partial(_forward_kernel, scale=scale, length=length, block=block, heads=h, rate=rate),
        grid=(b, h, n, n),
        in_specs=in_specs,
        out_specs=[spec(lambda b, h, i, j: (b, h, i, 0)),
                   pl.BlockSpec((None, None, 1, block), lambda b, h, i, j: (b, h, 0, i))],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, 1, length), jnp.float32)],
        scratch_shapes=[pltpu.VMEM((block, block), jnp.float32), pltpu.VMEM((block, block), jnp.float32),
                        pltpu.VMEM((block, d), jnp.float32), pltpu.VMEM((block, block), jnp.int32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name="disentangled_attention_fwd",
    )(*operands)
    return o, lse


def _backward(q, k, v, table_k, table_q, segments, keys, o, lse, do, scale, interpret, block=None, rate=0.0):
    """lse: [batch, heads, 1, L] float32, as the forward returns it."""
    b, h, length, d = q.shape
    block = block_size(length, interpret, block)
    n = length // block
    ids = segments[:, None, :]
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1)[:, :, None, :]  # [b, h, 1, L]
    table = pl.BlockSpec((None, 2 * length, d), lambda h, b, j, i: (h, 0, 0))
    table_out = jax.ShapeDtypeStruct((h, 2 * length, d), jnp.float32)
    row = lambda index: pl.BlockSpec((None, None, block, d), index)  # noqa: E731
    # Grid (h, b, k block j, q block i), key-major: statistics along the query lanes [1, block].
    qi_spec, kj_spec = row(lambda h, b, j, i: (b, h, i, 0)), row(lambda h, b, j, i: (b, h, j, 0))
    stat = pl.BlockSpec((None, None, 1, block), lambda h, b, j, i: (b, h, 0, i))
    whole = pl.BlockSpec((None, None, length, d), lambda h, b, j, i: (b, h, 0, 0))
    in_specs, operands = _with_keys(
        [qi_spec, kj_spec, kj_spec, table, table, pl.BlockSpec((None, 1, block), lambda h, b, j, i: (b, 0, i)),
         pl.BlockSpec((None, 1, block), lambda h, b, j, i: (b, 0, j))], (q, k, v, table_k, table_q, ids, ids),
        keys, rate)
    dq, dk, dv, dtk, dtq = pl.pallas_call(
        functools.partial(_backward_kernel, scale=scale, length=length, block=block, heads=h, rate=rate),
        grid=(h, b, n, n),
        in_specs=in_specs + [qi_spec, stat, stat],
        out_specs=[whole, kj_spec, kj_spec, table, table],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct(k.shape, k.dtype),
                   jax.ShapeDtypeStruct(v.shape, v.dtype), table_out, table_out],
        scratch_shapes=[pltpu.VMEM((length, d), jnp.float32), pltpu.VMEM((block, d), jnp.float32),
                        pltpu.VMEM((block, d), jnp.float32), pltpu.VMEM((block, block), jnp.int32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary", "arbitrary")),
        interpret=interpret, name="disentangled_attention_bwd",
    )(*operands, do, lse, delta)
    return dq, dk, dv, dtk.astype(table_k.dtype), dtq.astype(table_q.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10))
def fused_disentangled_attention(q, k, v, table_k, table_q, segments, keys, scale: float, interpret: bool,
                                 block: int | None = None, rate: float = 0.0):
    """dropout(softmax(scale * (q k^T + c2p + p2c) + mask)) v, fused. q, k, v: [batch, heads, L, head_dim];
    table_k, table_q: [heads, 2L, head_dim], row m the key / query projection of relative distance m - L + 1's
    bucket; segments: [batch, L] int32; keys: dropout_keys(...) [batch * heads] int32 where rate > 0, else
    None -> [batch, heads, L, head_dim]."""
    return _forward(q, k, v, table_k, table_q, segments, keys, scale, interpret, block, rate)[0]


def _vjp_forward(q, k, v, table_k, table_q, segments, keys, scale, interpret, block, rate):
    o, lse = _forward(q, k, v, table_k, table_q, segments, keys, scale, interpret, block, rate)
    return o, (q, k, v, table_k, table_q, segments, keys, o, lse)


def _vjp_backward(scale, interpret, block, rate, residuals, do):
    q, k, v, table_k, table_q, segments, keys, o, lse = residuals
    dq, dk, dv, dtk, dtq = _backward(q, k, v, table_k, table_q, segments, keys, o, lse, do, scale, interpret, block,
                                     rate)
    return dq, dk, dv, dtk, dtq, None, None


fused_disentangled_attention.defvjp(_vjp_forward, _vjp_backward)


# What the tiles execute, in units of one [block, block] x [block, head_dim] product (2 * block^2 * head_dim FLOPs): the
# forward's q k^T, p v and the two position terms against 2 * block relative rows (2 each): 6; the backward recomputes
# the scores once (5) and adds dO v^T, dv, dk and dq (1 each), both position terms' dk / dq and table gradients (2
# each): 17. 23 units against the 12 of the FLOP formula's attention term at S = 512, 2 * position_buckets = 512
# (bert_jax/train/perf.py), which is what the planner counts, as it counts splash's model FLOPs and not its backward's
# recomputation. (With dq and dk/dv in two kernels, as splash does, the scores were recomputed twice: 29 units.)
