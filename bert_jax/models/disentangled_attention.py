"""DeBERTa's disentangled self-attention (He et al. 2021, §3.1), as transformers' DebertaV2 computes it.

A score is content-to-content + content-to-position + position-to-content, all divided by
sqrt(3 * head_dim):

    s[i, j] = q_i . k_j  +  q_i . Kr[idx(i, j)]  +  k_j . Qr[idx(i, j)]

where Kr, Qr are the shared key/query projections of the relative-position embeddings
(`share_att_key`, DeBERTa-v3) and idx(i, j) the row of the log-bucketed distance i - j.
The two position terms are computed against the 2 * position_buckets embedding rows
([batch, heads, length, 2 * buckets]) and then gathered to [batch, heads, q, k]: no
[q, k, head_dim] tensor exists, so memory stays that of the scores. They enter the
shared attention kernel as its additive `score_bias`, where padding and packed segments
are masked exactly as for every family. Distances come from positions in the row: within
a packed document they equal the document's own, and pairs across documents are masked.
"""
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models.attention import AttentionMask, Attend, logit_scale
from bert_jax.models.layers import Dense

# content-to-content + content-to-position + position-to-content: the scale is sqrt(3 * head_dim).
SCORE_TERMS = 3
# The resolved kernel name (DebertaV3Config.attention_impl) of the fused Pallas kernel that
# `attention_impl=splash` (or `auto` on a TPU) means for this family.
FUSED_KERNEL = "disentangled_pallas"


def log_bucket_position(relative: np.ndarray, buckets: int, max_position: int) -> np.ndarray:
    """Distances within +-buckets/2 kept, longer ones log-spaced up to max_position (DebertaV2's
    `make_log_bucket_position`, in float32 as torch computes it, so bucket edges land on the same side)."""
    mid = buckets // 2
    sign = np.sign(relative)
    abs_pos = np.where((relative < mid) & (relative > -mid), mid - 1, np.abs(relative)).astype(np.float32)
    ratio = np.log(abs_pos / np.float32(mid)) / np.log(np.float32((max_position - 1) / mid))
    log_pos = np.ceil(ratio * np.float32(mid - 1)) + np.float32(mid)
    return np.where(abs_pos <= mid, relative, log_pos * sign).astype(np.int64)


@functools.lru_cache(maxsize=None)
def relative_embedding_index(length: int, buckets: int, max_position: int) -> np.ndarray:
    """[length, length] int32: the row of the 2 * buckets relative embeddings that query i uses for key j."""
    pos = np.arange(length)
    relative = log_bucket_position(pos[:, None] - pos[None, :], buckets, max_position)
    return np.clip(relative + buckets, 0, 2 * buckets - 1).astype(np.int32)


def disentangled_score_bias(q, k, pos_q, pos_k, index) -> jax.Array:
    """The c2p + p2c terms, unscaled. q, k: [batch, length, heads, head_dim]; pos_q, pos_k: [2 * buckets,
    heads, head_dim]; index: [length, length] -> [batch, heads, q, k] float32."""
    c2p = jnp.einsum("bqhd,rhd->bhqr", q, pos_k, preferred_element_type=jnp.float32)
    c2p = jnp.take_along_axis(c2p, jnp.asarray(index)[None, None], axis=-1)
    # p2c[i, j] = k_j . Qr[index[i, j]]: gathered per key j over index^T, then turned to [q, k].
    p2c = jnp.einsum("bkhd,rhd->bhkr", k, pos_q, preferred_element_type=jnp.float32)
    p2c = jnp.take_along_axis(p2c, jnp.asarray(index.T)[None, None], axis=-1)
    return c2p + jnp.swapaxes(p2c, -1, -2)


@functools.lru_cache(maxsize=None)
def distance_table_index(length: int, buckets: int, max_position: int) -> np.ndarray:
    """[2 * length] int32: row m is the relative-embedding row of distance m - length + 1 (the fused kernel's
    tables hold the projections by distance, so a tile's distances are consecutive rows)."""
    relative = log_bucket_position(np.arange(2 * length) - length + 1, buckets, max_position)
    return np.clip(relative + buckets, 0, 2 * buckets - 1).astype(np.int32)


def fused_attention(q, k, v, pos_q, pos_k, segments, buckets: int, max_position: int, interpret: bool,
                    block: int | None = None, dropout_rate: float = 0.0, dropout_seed: jax.Array | None = None,
                    scale: float | None = None):
    """The fused Pallas kernel (kernels/disentangled_attention.py) on [batch, length, heads, head_dim] q, k, v
    (unscaled), pos_q, pos_k [2 * buckets, heads, head_dim], segments [batch, length] -> [batch, length,
    heads, head_dim]; `dropout_seed` [2] int32 where dropout_rate > 0. Under a mesh it runs in shard_map over the
    batch and heads axes, as splash does, each shard drawing the dropout of its global rows and heads."""
    from bert_jax.kernels import disentangled_attention as kernel  # noqa: PLC0415 (Pallas: for TPU targets only)

    length, head_dim = q.shape[1], q.shape[-1]
    index = jnp.asarray(distance_table_index(length, buckets, max_position))
    # The model passes attention.logit_scale (μP's multiplier in it); 1/sqrt(3 x head_dim) otherwise.
    scale = float(1.0 / np.sqrt(SCORE_TERMS * head_dim)) if scale is None else float(scale)
    if dropout_rate and dropout_seed is None:
        raise ValueError("fused_attention: dropout_rate > 0 needs dropout_seed")
    seed = dropout_seed if dropout_rate else jnp.zeros((2,), jnp.int32)

    def run(q, k, v, pos_q, pos_k, segments, seed, batch_axes=None, head_axes=None):
        heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731  [b, l, h, d] -> [b, h, l, d]
        by_distance = lambda table: jnp.swapaxes(table[index], 0, 1).astype(q.dtype)  # noqa: E731 [h, 2L, d]
        keys = None
        if dropout_rate:
            batch, heads = q.shape[0], q.shape[2]
            first = lambda axes, size: 0 if axes is None else jax.lax.axis_index(axes) * size  # noqa: E731
            keys = kernel.dropout_keys(seed, batch, heads, first(batch_axes, batch), first(head_axes, heads))
        out = kernel.fused_disentangled_attention(heads_first(q), heads_first(k), heads_first(v), by_distance(pos_k),
                                                  by_distance(pos_q), segments, keys, scale, interpret, block,
                                                  dropout_rate)
        return heads_first(out)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return run(q, k, v, pos_q, pos_k, segments, seed)
    spec = nn.logical_to_mesh_axes(("batch", None, "heads", None))
    table = jax.P(None, spec[2], None)
    sharded = functools.partial(run, batch_axes=spec[0], head_axes=spec[2])
    return jax.shard_map(sharded, mesh=mesh, in_specs=(spec, spec, spec, table, table, jax.P(spec[0], None), jax.P()),
                         out_specs=spec, check_vma=False)(q, k, v, pos_q, pos_k, segments, seed)


class DisentangledSelfAttention(nn.Module):
    """q/k/v projections (shared with the position embeddings), the chosen kernel with the position
    terms as its score bias (the xla kernel), or the fused Pallas kernel that computes them per tile
(attention_impl == FUSED_KERNEL); the output projection. Parameter names are SelfAttention's."""

    config: Any  # num_heads, hidden_size, position_buckets, max_relative_positions, attention_impl, ...

    @nn.compact
    def __call__(self, x: jax.Array, rel_embeddings: jax.Array, mask: AttentionMask,
                 deterministic: bool) -> jax.Array:
        """x: [batch, length, hidden]; rel_embeddings: [2 * position_buckets, hidden] (normed) -> [batch,
        length, hidden]."""
        cfg = self.config
        heads, head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        dense = lambda name: Dense(  # noqa: E731
            (cfg.hidden_size,), (heads, head_dim), ("embed", "heads", "kv"),
            dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=nn.initializers.normal(cfg.initializer_range), name=name,
        )
        axes = ("batch", "length", "heads", "kv")
        query, key, value = dense("query"), dense("key"), dense("value")
        q, k, v = (nn.with_logical_constraint(proj(x), axes) for proj in (query, key, value))
        rel = nn.Dropout(cfg.dropout_rate)(rel_embeddings, deterministic=deterministic)
        if cfg.attention_impl == FUSED_KERNEL:
            rate = 0.0 if deterministic else cfg.attention_dropout_rate
            seed = None
            if rate:  # the layer's own dropout rng: reproducible from the step's key
                seed = jax.lax.bitcast_convert_type(jax.random.bits(self.make_rng("dropout"), (2,), jnp.uint32),
                                                    jnp.int32)
            context = fused_attention(q, k, v, query(rel), key(rel), mask.segments, cfg.position_buckets,
                                      cfg.max_relative_positions, cfg.splash_interpret, dropout_rate=rate,
                                      dropout_seed=seed, scale=logit_scale(cfg, head_dim, SCORE_TERMS))
            return self._output(context)
        index = relative_embedding_index(x.shape[1], cfg.position_buckets, cfg.max_relative_positions)
        scale = 1.0 / np.sqrt(SCORE_TERMS * head_dim)
        bias = disentangled_score_bias(q, k, query(rel), key(rel), index) * scale
        # The kernel divides q . k by sqrt(head_dim); the remaining 1/sqrt(3) goes on q.
        q_scaled = q * jnp.asarray(1.0 / np.sqrt(SCORE_TERMS), q.dtype)
        context = Attend(cfg, name="attend")(q_scaled, k, v, mask, deterministic, score_bias=bias)
        return self._output(context)

    def _output(self, context: jax.Array) -> jax.Array:
        cfg = self.config
        heads, head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        context = nn.with_logical_constraint(context, ("batch", "length", "heads", "kv"))
        return Dense(
            (heads, head_dim), (cfg.hidden_size,), ("heads", "kv", "embed"),
            dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=nn.initializers.normal(cfg.initializer_range), name="output",
        )(context)
