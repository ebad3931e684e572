"""The attention kernels behind `config.model.attention_impl`: xla (the reference), cudnn, splash, triton.

Every kernel computes softmax(q k^T / sqrt(head_dim) + mask) v for q, k, v: [batch, length,
heads, head_dim] in the compute dtype, with the mask described by `segments` (see
`attention.attention_segments`): a query attends to the keys of its own segment (padding is a
segment of its own), within `window` positions either side when a window is given. Causal
(`causal=True`, a causal objective's): only keys at or before the query, `window` of them back.
xla, splash and the windowed Pallas (Triton) kernel apply it; cuDNN does not here, and
`models.attention.choose_kernel` refuses it for a causal model before anything compiles.

Outputs at padding positions differ between kernels (cuDNN lets a padding query see the real
keys, xla, splash and triton let it see the other padding keys); they are finite everywhere, and
nothing downstream reads them, so every kernel gives the same outputs at real tokens and the
same gradients.
"""
import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.kernels import windowed_attention

# --- xla: our own einsum path -----------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def softmax_saving_probs_in(logits: jax.Array, dtype) -> jax.Array:
    """float32 softmax over the last axis, returned in `dtype`; the backward keeps only that copy.

    jax.nn.softmax saves its float32 output for the backward, and the cast to the compute dtype
    saves a second copy: two [batch, heads, q, k] tensors, one of them float32, per layer. Here
    the backward recomputes from the compute-dtype probabilities in float32 (the statistics stay
    float32), as Megatron-LM's fused softmax does; in float32 it is jax.nn.softmax exactly.
    """
    return jax.nn.softmax(logits, axis=-1).astype(dtype)


def _softmax_fwd(logits, dtype):
    probs = softmax_saving_probs_in(logits, dtype)
    return probs, probs


def _softmax_bwd(dtype, probs, g):
    p, g = probs.astype(jnp.float32), g.astype(jnp.float32)
    return (p * (g - jnp.sum(g * p, axis=-1, keepdims=True)),)


softmax_saving_probs_in.defvjp(_softmax_fwd, _softmax_bwd)


def allowed_keys(segments: jax.Array, window: int | None, causal: bool = False) -> jax.Array:
    """[batch, 1, q, k] bool: same segment, and within `window` positions when one is given; causal: only
    keys at or before the query (0 <= q - k, and q - k <= window with a window).

    Built from [batch, length] ids inside the attention: no [batch, heads, q, k] mask or bias is
    ever stored or copied per head.
    """
    if window is None and not causal:
        return segments[:, None, :, None] == segments[:, None, None, :]
    positions = jnp.arange(segments.shape[1])
    return allowed_between(segments, segments, positions, positions, window, causal)


def allowed_between(q_segments, k_segments, q_positions, k_positions, window: int | None,
                    causal: bool = False) -> jax.Array:
    """allowed_keys for queries and keys that need not be the same tokens (a shard's queries against a block of
    another's keys, bert_jax/kernels/context_attention.py): segment ids [batch, q] / [batch, k], row positions
    [q] / [k]."""
    allowed = q_segments[:, None, :, None] == k_segments[:, None, None, :]
    back = q_positions[:, None] - k_positions[None, :]  # q - k
    if causal:
        allowed = allowed & (back >= 0)
    if window is not None:
        allowed = allowed & ((back <= window) if causal else (jnp.abs(back) <= window))
    return allowed


def xla_attention(q, k, v, segments, window: int | None, probs_dropout: Callable | None = None,
                  score_bias: jax.Array | None = None, observe_probs: Callable | None = None,
                  causal: bool = False) -> jax.Array:
    """The reference. q, k, v: [batch, length, heads, head_dim] -> [batch, length, heads, head_dim].

    Logits come out of the matmul in float32 (no compute-dtype rounding before the softmax);
    `probs_dropout`, when given, is applied to the probabilities (Devlin et al.'s attention dropout).
    `score_bias` [batch, heads, q, k] float32, when given, is added to the scaled logits before the
    mask (DeBERTa's position terms), so it meets padding and packed segments exactly as they do.
    `observe_probs`, when given, is called with the probabilities [batch, heads, q, k] before dropout.
    """
    scale = 1.0 / np.sqrt(q.shape[-1])
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    if score_bias is not None:
        logits = logits + score_bias.astype(jnp.float32)
    # An additive [batch, 1, q, k] bias, broadcast over heads inside the softmax's fusion. A select
    # against a scalar instead made XLA hoist that scalar's broadcast out of the layer scan as a
    # float32 [batch, heads, q, k] tensor (seen in the compiled CPU step).
    bias = jnp.where(allowed_keys(segments, window, causal), 0.0, jnp.finfo(jnp.float32).min)
    logits = logits + bias
    probs = softmax_saving_probs_in(logits, q.dtype)
    if observe_probs is not None:
        observe_probs(probs)
    if probs_dropout is not None:
        probs = probs_dropout(probs)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


# The most bytes one chunk's float32 scores may take on a device: at 32,768 keys, 4 rows and 12 heads a chunk of 512
# queries would take 3.2 GB, of which the backward holds several copies (the v5e-16 32k plan, docs/results).
SCORES_BYTES = 2**30


def query_chunk(shard_length: int, keys: int = 0, rows_heads: int = 1, most: int = 512) -> int:
    """The queries one step of xla_attention_by_query_chunks (or the ring, or the halo) takes per shard: the largest
    divisor of the shard's length up to `most`, to half of it (at least two steps, so every split run loops) and to
    what keeps a chunk's float32 scores against `keys` keys, for `rows_heads` rows x heads on a device, within
    SCORES_BYTES."""
    cap = max(1, min(most, shard_length // 2, SCORES_BYTES // (4 * rows_heads * keys) if keys else most))
    return max(m for m in range(1, cap + 1) if shard_length % m == 0)


def devices_along(logical: str) -> int:
    """How many devices the logical axis `logical` is split over under the mesh and rules in force (1 outside them)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    axes = nn.logical_to_mesh_axes((logical,))[0]
    axes = axes if isinstance(axes, tuple) else (axes,)
    return int(np.prod([mesh.shape[a] for a in axes if a is not None and a in mesh.shape]))


def xla_attention_by_query_chunks(q, k, v, segments, window: int | None, shards: int,
                                  causal: bool = False) -> jax.Array:
    """xla_attention (no dropout, no score bias) over each device's queries a chunk at a time, each chunk
    rematerialised in the backward: a device holds one chunk's [batch, heads, chunk, length] scores, not its
    whole shard's. For a sequence split over `shards` devices (context parallelism), where the scores of one
    shard's queries against every key are what does not fit; each softmax row is whole, so the result is xla's.

    q: [batch, length, heads, head_dim] split along length into `shards`; k, v whole along length.
    """
    b, length, h, d = q.shape
    shard = length // shards
    m = query_chunk(shard, k.shape[1], -(-b // devices_along("batch")) * -(-h // devices_along("heads")))
    n = shard // m
    scale = 1.0 / np.sqrt(d)
    # [n, batch, shards, m, ...]: step j takes the j-th chunk of every shard, so all devices work at once.
    split = lambda x: jnp.moveaxis(x.reshape(x.shape[0], shards, n, m, *x.shape[2:]), 2, 0)  # noqa: E731
    q_chunks = nn.with_logical_constraint(split(q), (None, "batch", "length", None, "heads", "kv"))
    q_segments = nn.with_logical_constraint(split(segments), (None, "batch", "length", None))
    q_positions = split(jnp.arange(length)[None])[:, 0]  # [n, shards, m]
    k_positions = jnp.arange(k.shape[1])
    k_segments = nn.with_logical_constraint(segments, ("batch", None))  # every key's, as k and v

    @jax.checkpoint
    def one_chunk(qc, qseg, qpos):
        logits = jnp.einsum("bcqhd,bkhd->bhcqk", qc, k, preferred_element_type=jnp.float32) * scale
        allowed = qseg[:, None, :, :, None] == k_segments[:, None, None, None, :]
        back = qpos[:, :, None] - k_positions  # q - k, [shards, m, keys]
        if causal:
            allowed = allowed & (back >= 0)
        if window is not None:
            allowed = allowed & ((back <= window) if causal else (jnp.abs(back) <= window))
        logits = logits + jnp.where(allowed, 0.0, jnp.finfo(jnp.float32).min)
        probs = softmax_saving_probs_in(logits, q.dtype)
        return jnp.einsum("bhcqk,bkhd->bcqhd", probs, v)

    out = jax.lax.map(lambda xs: one_chunk(*xs), (q_chunks, q_segments, q_positions))  # [n, b, shards, m, h, d]
    return jnp.moveaxis(out, 0, 2).reshape(b, length, h, d)


# --- cudnn: NVIDIA's fused flash attention -------------------------------------------------


def segment_offsets(segments: jax.Array, max_segments: int) -> tuple[jax.Array, jax.Array]:
    """cuDNN's packed layout from [batch, length] segment ids (padding -1, segments contiguous).

    Returns (offsets [batch, max_segments + 1], lengths [batch, max_segments]) int32: where each
    segment starts and how long it is, -1 in the unused slots, as jax's cuDNN API wants them.
    """
    b, length = segments.shape
    real = segments >= 0
    prev = jnp.pad(segments[:, :-1], ((0, 0), (1, 0)), constant_values=-2)
    starts = real & (segments != prev)
    rank = jnp.cumsum(starts, axis=1) - 1  # segment number of each token
    rows = jnp.arange(b)[:, None]
    pos = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (b, length))
    offsets = jnp.full((b, max_segments + 1), -1, jnp.int32).at[rows, jnp.where(starts, rank, max_segments + 1)].set(
        pos, mode="drop")
    lengths = jnp.zeros((b, max_segments), jnp.int32).at[rows, jnp.where(real, rank, max_segments)].add(
        1, mode="drop")
    return offsets, jnp.where(lengths > 0, lengths, -1)


def cudnn_attention(q, k, v, segments, window: int | None, packed: bool, causal: bool = False,
                    implementation: str = "cudnn") -> jax.Array:
    """cuDNN flash attention; q, k, v in bfloat16 or float16.

    Padding goes in as key lengths (padding trails every row, as the pipeline builds them): a
    [batch, 1, q, k] bias would cost a bias gradient and is slow broadcast per head
    (docs/results/gpu.md). Packed rows use cuDNN's ragged layout (segment offsets and lengths;
    Hopper or later), through jax's cuDNN API: jax.nn.dot_product_attention does not take
    offsets in jax 0.10. A bidirectional window cannot be expressed: jax 0.10's cuDNN path
    takes only a left (causal) window. `causal` (unpadded or padded rows, not packed ones): keys at or
    before the query, `window` of them back (jax's local_window_size=(window, 0)), as xla_attention's.
    `implementation`: "cudnn"; "xla" runs jax's same call on any backend, which pins the masks' meaning
    where no GPU is (tests/test_causal_lm.py).
    """
    if window is not None and not causal:
        raise ValueError(
            "config.model.attention_impl='cudnn' cannot apply a sliding window: jax's cuDNN attention "
            "takes only a causal (left) window. Use attention_impl='xla' (or 'auto')."
        )
    real = segments >= 0
    if not packed:
        lengths = jnp.sum(real, axis=1, dtype=jnp.int32)
        return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, is_causal=causal,
                                            local_window_size=None if window is None else (window, 0),
                                            implementation=implementation)
    if causal:
        raise ValueError("config.model.attention_impl='cudnn' does not apply causal attention to packed rows here "
                         "(cuDNN's ragged layout is not wired causal); use attention_impl='triton' or 'xla'")
    from jax._src.cudnn import fused_attention_stablehlo as cudnn  # the API with segment offsets

    # Every packed sequence holds at least [CLS] x [SEP] (data_pipelines/examples/packing.py), so a row of
    # L tokens holds at most L // 3 of them; a static bound is what cuDNN's layout needs.
    max_segments = max(1, q.shape[1] // 3)
    offsets, lengths = segment_offsets(segments, max_segments)
    out = cudnn.dot_product_attention(
        q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets, kv_offsets=offsets,
        scale=1.0 / np.sqrt(q.shape[-1]), mask_type=cudnn.MaskType.PADDING,
    )
    # Tokens outside every segment (the padding tail) are not written by the kernel.
    return jnp.where(real[:, :, None, None], out, 0).astype(q.dtype)


# --- splash: TPU Pallas splash attention ----------------------------------------------------


def splash_block_size(length: int) -> int:
    """The largest of 512, 256, 128 that divides `length`; splash's kv compute block must be a
    multiple of 128 lanes."""
    for block in (512, 256, 128):
        if length % block == 0:
            return block
    raise ValueError(
        f"config.model.attention_impl='splash' needs a sequence length that is a multiple of 128 "
        f"(config.data.max_seq_length); got {length}. Use attention_impl='xla', or pad the length."
    )


def _splash_kernel(length: int, heads: int, window: int | None, interpret: bool, causal: bool = False,
                   kv_length: int | None = None):
    """Splash for `length` queries against `kv_length` keys (default `length`); a window or causal mask needs the
    two equal (the query's place in the row is its index)."""
    # Built per trace, not cached: its mask tables are created as arrays inside the trace.
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    kv_length = kv_length or length
    block, kv_block = splash_block_size(length), splash_block_size(kv_length)
    blocks = splash.BlockSizes(block_q=block, block_kv=kv_block, block_kv_compute=kv_block, block_q_dkv=block,
                               block_kv_dkv=kv_block, block_kv_dkv_compute=kv_block, block_q_dq=block,
                               block_kv_dq=kv_block)
    if window is None:
        head_mask = splash.CausalMask((length, length)) if causal else splash.FullMask((length, kv_length))
    else:  # keys from q - window to q + window (q + 0 when causal)
        head_mask = splash.LocalMask((length, length), (window, 0 if causal else window), offset=0)
    mask = splash.MultiHeadMask([head_mask] * heads)
    return splash.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1, interpret=interpret)


def splash_attention(q, k, v, segments, window: int | None, interpret: bool, causal: bool = False) -> jax.Array:
    """Splash attention, vmapped over the batch; segments are its segment ids directly. Causal: its causal (or
    one-sided local) mask, whose tiles above the diagonal it skips.

    Under a mesh the kernel runs in shard_map over the batch and heads axes (a Pallas call is
    not partitioned by XLA), each device on its own rows and heads.
    """
    run = lambda q, k, v, segments: splash_rows(q, k, v, segments, segments, window, interpret, causal)  # noqa: E731
    return per_shard(run, q, k, v, segments)


def splash_rows(q, k, v, q_segments, kv_segments, window: int | None, interpret: bool,
                causal: bool = False) -> jax.Array:
    """The splash kernel on one device's rows: q [batch, q_length, heads, head_dim] against k, v [batch, kv_length,
    ...], with their segment ids [batch, q_length] and [batch, kv_length]."""
    # Pallas' TPU kernels: loaded only by a run that picked splash (a TPU, or interpret mode in tests).
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    scale = 1.0 / np.sqrt(q.shape[-1])
    kernel = _splash_kernel(q.shape[1], q.shape[2], window, interpret, causal, kv_length=k.shape[1])
    to_heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [b, l, h, d] -> [b, h, l, d]
    out = jax.vmap(kernel)(to_heads_first(q * jnp.asarray(scale, q.dtype)), to_heads_first(k), to_heads_first(v),
                           segment_ids=splash.SegmentIds(q=q_segments, kv=kv_segments))
    return to_heads_first(out).astype(q.dtype)


def per_shard(run: Callable, q, k, v, segments) -> jax.Array:
    """run(q, k, v, segments) on each device's rows and heads: a Pallas call is not partitioned by XLA, so under a
    mesh it runs in shard_map over the batch and heads axes."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return run(q, k, v, segments)
    spec = nn.logical_to_mesh_axes(("batch", None, "heads", None))
    return jax.shard_map(run, mesh=mesh, in_specs=(spec, spec, spec, jax.P(spec[0], None)), out_specs=spec,
                         check_vma=False)(q, k, v, segments)


# --- triton: our Pallas GPU flash kernel with the sliding window (kernels/windowed_attention.py) ------------------


def triton_attention(q, k, v, segments, window: int | None, interpret: bool, scale: float | None = None,
                     causal: bool = False) -> jax.Array:
    """The Pallas GPU (Triton) flash kernel: padding, packed segments and a bidirectional window (or a causal one),
    tiles outside the window never visited. `scale` defaults to the xla reference's 1 / sqrt(head_dim)."""
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    run = lambda q, k, v, segments: windowed_attention.windowed_attention(  # noqa: E731
        q, k, v, segments, window, scale, interpret=interpret, causal=causal)
    return per_shard(run, q, k, v, segments)
