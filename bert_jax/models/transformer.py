"""The post-LN transformer encoder stack that BERT-family models share.

Layers run through `nn.scan` (one compiled layer, parameters stacked on a `layers`
axis) or unrolled, by `config.scan_layers`; each layer may be rematerialised with
the policy named by `config.remat_policy`. Hidden dropout draws its masks in each layer, or
(`config.dropout_masks='per_step'`) all layers' at once, before the stack.
"""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.attention import AttentionMask, SelfAttention, platform_name
from bert_jax.models.layers import ACTIVATIONS, Dense, DropoutKey, LayerNorm

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# "auto" is the pre-training program's to resolve to none or full by whether its compiled step fits the device
# (bert_jax/train/remat_auto.py); a module built anywhere else (fine-tuning, export, the planner's shapes) runs it
# as none.
REMAT_CHOICES = (*REMAT_POLICIES, "auto")


def remats(policy: str) -> bool:
    """Whether layers under config.model.remat_policy=`policy` are wrapped in nn.remat."""
    return policy not in ("none", "auto")


def rematerialised(layer, cfg, static_argnums: tuple[int, ...]):
    """`layer` (a module class) wrapped in nn.remat with cfg.remat_policy's policy, or as it is where the policy
    keeps everything; `static_argnums` count self, as nn.remat's do."""
    if not remats(cfg.remat_policy):
        return layer
    return nn.remat(layer, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=not cfg.scan_layers,
                    static_argnums=static_argnums)


def layers_per_iteration(model_cfg) -> int:
    """nn.scan's unroll as the model runs it: `config.model.scan_unroll`, except that an NVIDIA GPU target with
    `config.model.unroll_on_gpu` (the default) and no remat runs a scan_unroll of 1 as the whole stack (num_layers:
    >= every layer loop's length), parameters still stacked [layers, ...]. With a remat policy the loop stays: in
    one straight-line program the compiler may merge a layer's recomputation with its forward (nn.remat's
    prevent_cse is off for scanned layers), and that was not measured.

    Why: a rolled scan's forward writes every saved residual into a zero-filled [layers, ...] stack (the fill,
    then a copy of each cuBLAS or cuDNN output into its slot) and its backward copies each slot out again. On
    XLA's GPU compiler that is 44 GB of BERT-base (128, 256)'s 136 GB per step; unrolled, the residuals stay
    where their kernels wrote them: 89 GB (docs/results/gpu.md, 2026-12-04). Other platforms keep the loop
    (not measured unrolled).

    On the compiler's count alone: no GPU has run the unrolled step. The first GPU run must check that its losses
    and gradients equal the rolled scan's (bench/gpu_kernel_checks.py) and the ELECTRA step's peak, which the count
    puts 15 % above the rolled one's.
    """
    if not model_cfg.get("scan_layers", True):  # no scanned loop: scan_unroll and unroll_on_gpu are unread (and
        return 1  # refused at another value than configs/base.py's, bert_jax/families.py UNROLLED)
    unroll = model_cfg.get("scan_unroll", 1)
    if (unroll == 1 and model_cfg.get("unroll_on_gpu", False) and not remats(model_cfg.get("remat_policy", "none"))
            and platform_name() == "gpu"):
        return model_cfg.get("num_layers", 1)
    return unroll


class TransformerLayer(nn.Module):
    """Post-LN: x = LN(x + Attn(x)); x = LN(x + MLP(x)), as in Devlin et al. 2019 (MLP activation: hidden_act)."""

    config: Any

    @nn.compact
    def __call__(self, x: jax.Array, mask: AttentionMask, deterministic: bool, keep: jax.Array | None = None):
        """keep: [2, batch, length, hidden] bool, this layer's two hidden-dropout masks when the stack drew them
        (config.model.dropout_masks='per_step'), else None: drawn here, per layer."""
        cfg = self.config

        def dropout(h, i):
            if keep is None:
                return nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
            return jax.lax.select(keep[i], h / jnp.asarray(1.0 - cfg.dropout_rate, h.dtype), jnp.zeros_like(h))

        def add_and_norm(x, h, i, name):
            norm = LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, name=name)
            if keep is None and not deterministic and cfg.dropout_rate > 0 and cfg.fused_dropout_norm:
                # The mask nn.Dropout (auto-named Dropout_{i} here) would draw, re-drawn in the backward.
                return norm(x, h, DropoutKey(name=f"Dropout_{i}")(), cfg.dropout_rate)
            return norm(x + dropout(h, i))

        h = SelfAttention(cfg, name="attention")(x, mask, deterministic)
        x = add_and_norm(x, h, 0, "attention_norm")
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
        x = add_and_norm(x, h, 1, "mlp_norm")
        return nn.with_logical_constraint(x, ("batch", "length", "embed")), None


class TransformerStack(nn.Module):
    """`num_layers` TransformerLayers, scanned or unrolled; parameters are identical in content either way."""

    config: Any

    @nn.compact
    def __call__(self, x: jax.Array, mask: AttentionMask, deterministic: bool) -> jax.Array:
        cfg = self.config
        layer = TransformerLayer
        keep = None
        if cfg.dropout_masks == "per_step" and not deterministic and cfg.dropout_rate > 0:
            # Every layer's hidden-dropout masks in one draw, before the layers: a few large RNG kernels per step
            # instead of two small draws (and their key splits) inside each layer. Other masks than per_layer's,
            # of the same keep rate; held until the backward, as the per-layer masks are.
            keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - cfg.dropout_rate,
                                        (cfg.num_layers, 2) + x.shape)
        layer = rematerialised(layer, cfg, (3,))  # deterministic (argnum 3 counting self) is a Python bool: static
        if cfg.scan_layers:
            stack = nn.scan(
                layer,
                variable_axes={"params": 0, "intermediates": 0},  # sown values (inspect) get a layers axis
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast, nn.broadcast if keep is None else 0),
                length=cfg.num_layers,
                unroll=cfg.scan_unroll,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = stack(cfg, name="layers")(x, mask, deterministic, keep)
            return x
        for i in range(cfg.num_layers):
            x, _ = layer(cfg, name=f"layers_{i}")(x, mask, deterministic, None if keep is None else keep[i])
        return x
