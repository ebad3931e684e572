"""The post-LN transformer encoder stack that BERT-family models share.

Layers run through `nn.scan` (one compiled layer, parameters stacked on a `layers`
axis) or unrolled, by `config.scan_layers`; each layer may be rematerialised with
the policy named by `config.remat_policy`.
"""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.layers import ACTIVATIONS, Dense, LayerNorm

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def attention_bias(attention_mask: jax.Array, segment_ids: jax.Array | None, dtype) -> jax.Array:
    """Additive bias [batch, 1, q_length, k_length]: 0 where a query may attend, a large negative elsewhere.

    attention_mask: [batch, length], 1 for real tokens and 0 for padding.
    segment_ids: [batch, length] or None; with packed sequences a query sees only
    keys of its own segment, so attention never crosses documents.
    """
    allowed = attention_mask[:, None, None, :].astype(bool)
    if segment_ids is not None:
        allowed = allowed & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    return jnp.where(allowed, 0.0, jnp.finfo(dtype).min).astype(dtype)


class SelfAttention(nn.Module):
    config: Any

    @nn.compact
    def __call__(self, x: jax.Array, bias: jax.Array, deterministic: bool) -> jax.Array:
        """x: [batch, length, hidden]; bias: [batch, 1, length, length]."""
        cfg = self.config
        heads, head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        dense = lambda name: Dense(  # noqa: E731
            (cfg.hidden_size,), (heads, head_dim), ("embed", "heads", "kv"),
            dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=nn.initializers.normal(cfg.initializer_range), name=name,
        )
        q, k, v = dense("query")(x), dense("key")(x), dense("value")(x)
        q = nn.with_logical_constraint(q, ("batch", "length", "heads", "kv"))
        k = nn.with_logical_constraint(k, ("batch", "length", "heads", "kv"))
        v = nn.with_logical_constraint(v, ("batch", "length", "heads", "kv"))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / jnp.sqrt(head_dim).astype(jnp.float32)
        probs = jax.nn.softmax(scores + bias.astype(jnp.float32), axis=-1).astype(cfg.dtype)
        probs = nn.Dropout(cfg.attention_dropout_rate)(probs, deterministic=deterministic)
        context = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
        context = nn.with_logical_constraint(context, ("batch", "length", "heads", "kv"))
        return Dense(
            (heads, head_dim), (cfg.hidden_size,), ("heads", "kv", "embed"),
            dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=nn.initializers.normal(cfg.initializer_range), name="output",
        )(context)


class TransformerLayer(nn.Module):
    """Post-LN: x = LN(x + Attn(x)); x = LN(x + MLP(x)), as in Devlin et al. 2019 (MLP activation: hidden_act)."""

    config: Any

    @nn.compact
    def __call__(self, x: jax.Array, bias: jax.Array, deterministic: bool):
        cfg = self.config
        dropout = nn.Dropout(cfg.dropout_rate)
        h = SelfAttention(cfg, name="attention")(x, bias, deterministic)
        x = LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, name="attention_norm")(
            x + dropout(h, deterministic=deterministic)
        )
        h = Dense(
            (cfg.hidden_size,), (cfg.intermediate_size,), ("embed", "mlp"),
            dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=nn.initializers.normal(cfg.initializer_range), name="intermediate",
        )(x)
        h = nn.with_logical_constraint(ACTIVATIONS[cfg.hidden_act](h), ("batch", "length", "mlp"))
        h = Dense(
            (cfg.intermediate_size,), (cfg.hidden_size,), ("mlp", "embed"),
            dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=nn.initializers.normal(cfg.initializer_range), name="mlp_output",
        )(h)
        x = LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, name="mlp_norm")(
            x + dropout(h, deterministic=deterministic)
        )
        return nn.with_logical_constraint(x, ("batch", "length", "embed")), None


class TransformerStack(nn.Module):
    """`num_layers` TransformerLayers, scanned or unrolled; parameters are identical in content either way."""

    config: Any

    @nn.compact
    def __call__(self, x: jax.Array, bias: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.config
        layer = TransformerLayer
        policy = REMAT_POLICIES[cfg.remat_policy]
        if cfg.remat_policy != "none":
            # deterministic (argnum 3 counting self) is a Python bool: static.
            layer = nn.remat(layer, policy=policy, prevent_cse=not cfg.scan_layers, static_argnums=(3,))
        if cfg.scan_layers:
            stack = nn.scan(
                layer,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast),
                length=cfg.num_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = stack(cfg, name="layers")(x, bias, deterministic)
            return x
        for i in range(cfg.num_layers):
            x, _ = layer(cfg, name=f"layers_{i}")(x, bias, deterministic)
        return x
