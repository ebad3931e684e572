"""ModernBERT (Warner et al. 2024): pre-LN, rotary positions, GeGLU, alternating local/global attention.

The module follows transformers' `ModernBertForMaskedLM`, so that weights move both ways:
- embeddings: token embedding, LayerNorm, dropout; no absolute positions, no token types;
- pre-LN layers: x += Wo(attn(attn_norm(x))); x += Wo(act(in) * gate)(mlp_norm(x)), with a
  fused Wqkv and a GeGLU Wi projecting to 2 x intermediate; layer 0 has no attn_norm (its input
  is the embedding norm's output), and a final norm follows the last layer;
- rotary positions on q and k (half-split rotation, as HF's `rotate_half`), theta
  `global_rope_theta` on global layers and `local_rope_theta` on local ones, read at
  `position_ids`: packed rows restart them per document;
- layer i is global when i % global_attn_every_n_layers == 0, else local: it sees
  `local_attention // 2` tokens either side (HF's `sliding_window`, |q - k| <= 64 for 128),
  and never across a document (the window combines with the segment mask in `Attend`);
- the MLM head (dense, act, norm, then the decoder tied to the embeddings with its own bias)
  only at the masked positions.

Causal (`config.model.objective='clm'`, Ettin's decoders: transformers' `ModernBertDecoderForCausalLM`): the same
parameters, every layer attends only backwards, a local layer over `local_attention // 2` tokens, itself included
(HF's decoder `sliding_window`: key k is seen from query q when 0 <= q - k < local_attention // 2, half the
encoder's window since it looks one way), and the head runs at every position (`clm_logits`).

Layout: `encoder/word` (HF's tok_embeddings, named as BERT's table so that perf.py's FLOP count
leaves it out), `encoder/first_layer` (HF layer 0, no attn_norm) and `encoder/layers` scanned over the
other num_layers - 1 (or `layers_0` ... unrolled: `layers_i` is HF layer i + 1). Local and global
layers share one scanned body: whether a layer is global enters the scan as a per-layer input,
which picks theta and, through `nn.cond`, the attention with or without its (static) window, so
every kernel, splash included, sees a static window.
"""
import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.models.attention import Attend, KernelChoice, attention_mask_from_batch, choose_kernel
from bert_jax.models import parametrization
from bert_jax.models.bert import DTYPES
from bert_jax.models.layers import ACTIVATIONS, Dense, Embed, EncoderModel, LayerNorm, MaskedLMHead
from bert_jax.models.transformer import REMAT_CHOICES, layers_per_iteration, rematerialised
from bert_jax.objective_names import is_causal


@dataclasses.dataclass(frozen=True)
class ModernBertConfig:
    """The model's hyper-parameters, frozen and hashable; defaults are ModernBERT-base's."""

    vocab_size: int = 50368
    hidden_size: int = 768
    num_layers: int = 22
    num_heads: int = 12
    intermediate_size: int = 1152
    max_position_embeddings: int = 8192
    dropout_rate: float = 0.0  # after the embeddings and inside the MLP (HF embedding_dropout, mlp_dropout)
    attention_dropout_rate: float = 0.0  # on attention probabilities and after Wo (HF attention_dropout)
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0
    hidden_act: str = "gelu"  # the MLP's and the head's activation (HF hidden_activation, classifier_activation)
    local_attention: int = 128  # a local layer's whole window: local_attention // 2 tokens either side
    global_attn_every_n_layers: int = 3
    global_rope_theta: float = 160_000.0
    local_rope_theta: float = 10_000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    norm_bias: bool = False
    decoder_bias: bool = True
    classifier_bias: bool = False  # the MLM head's dense layer
    pad_token_id: int = 0
    scan_layers: bool = True
    # Layers per iteration of the scanned loop (nn.scan's unroll; >= the loop's length unrolls it whole, which
    # the TPU planner does to count every layer's FLOPs and bytes, bert_jax/plan/compiled_plan.py). from_config
    # resolves config.model.unroll_on_gpu for the platform (transformer.layers_per_iteration).
    scan_unroll: int = 1
    remat_policy: str = "none"
    attention_impl: str = "xla"
    splash_interpret: bool = False
    # The attention logits' factor beyond 1/sqrt(head_dim): μP's (bert_jax/models/parametrization.py), 1 under
    # standard; from_config derives it from config.model.parametrization and mup_base_width.
    attention_multiplier: float = 1.0
    causal: bool = False  # a causal objective's (from_config reads config.model.objective)
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @classmethod
    def from_config(cls, model_cfg) -> "ModernBertConfig":
        """Builds from `config.model`; keys this dataclass does not know (e.g. `family`) are ignored."""
        check_model_config(model_cfg)
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in model_cfg.items() if k in fields}
        for key in ("dtype", "param_dtype"):
            if key in values:
                if values[key] not in DTYPES:
                    raise ValueError(f"config.model.{key}={values[key]!r}; expected one of {sorted(DTYPES)}")
                values[key] = DTYPES[values[key]]
        values["attention_impl"] = cls.kernel_choice(model_cfg).impl
        values["attention_multiplier"] = parametrization.attention_multiplier(model_cfg)
        values["scan_unroll"] = layers_per_iteration(model_cfg)
        values["causal"] = is_causal(model_cfg)
        return cls(**values)

    @classmethod
    def kernel_choice(cls, model_cfg) -> KernelChoice:
        """The attention kernel `config.model` resolves to: cuDNN cannot apply the local layers' window."""
        return choose_kernel(model_cfg, window=has_local_layers(model_cfg), causal=is_causal(model_cfg))

    def is_global(self, layer: int) -> bool:
        return layer % self.global_attn_every_n_layers == 0


def has_local_layers(model_cfg) -> bool:
    return model_cfg.get("global_attn_every_n_layers", 3) > 1 and model_cfg.get("num_layers", 22) > 1


def check_model_config(model_cfg) -> None:
    """The keys ModernBERT adds, checked before anything is built; errors name the key."""
    get = model_cfg.get
    every = get("global_attn_every_n_layers", 3)
    if every < 1:
        raise ValueError(f"config.model.global_attn_every_n_layers={every} must be >= 1 (1: every layer global)")
    local = get("local_attention", 128)
    if local < 2 or local % 2:
        raise ValueError(f"config.model.local_attention={local} must be an even number >= 2: the window is "
                         f"local_attention // 2 tokens either side, as in Hugging Face's ModernBERT")
    if get("num_layers", 22) < 2:
        raise ValueError(f"config.model.num_layers={get('num_layers')} must be >= 2")
    if get("hidden_act", "gelu") not in ACTIVATIONS:
        raise ValueError(f"config.model.hidden_act={get('hidden_act')!r}; expected one of {sorted(ACTIVATIONS)}")
    if get("remat_policy", "none") not in REMAT_CHOICES:
        raise ValueError(f"config.model.remat_policy={get('remat_policy')!r}; expected one of "
                         f"{sorted(REMAT_CHOICES)}")


def rotary(x: jax.Array, positions: jax.Array, theta) -> jax.Array:
    """x: [batch, length, heads, head_dim] rotated by positions [batch, length] at base `theta` (a float or a
    traced scalar), in float32 as HF's apply_rotary_pos_emb; the halves rotate together (`rotate_half`)."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (jnp.asarray(theta, jnp.float32) ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    freqs = positions[..., None].astype(jnp.float32) * inv_freq
    angles = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-second, first], axis=-1)
    return (x32 * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)


def _init(std: float, cutoff: float):
    # HF's trunc_normal_(std, a=-cutoff*std, b=cutoff*std); jax's stddev is that of the truncated draw.
    return nn.initializers.truncated_normal(std, lower=-cutoff, upper=cutoff)


class ModernBertLayer(nn.Module):
    """One pre-LN layer; `is_global` picks theta and the window (a Python bool unrolled, a traced one scanned)."""

    config: ModernBertConfig
    attn_norm: bool = True  # False for layer 0, as HF (its input is already the embedding norm's output)

    @nn.compact
    def __call__(self, x: jax.Array, mask, positions: jax.Array, is_global, deterministic: bool):
        cfg = self.config
        heads, head_dim = cfg.num_heads, cfg.hidden_size // cfg.num_heads
        init_in = _init(cfg.initializer_range, cfg.initializer_cutoff_factor)
        init_out = _init(cfg.initializer_range / np.sqrt(2.0 * cfg.num_layers), cfg.initializer_cutoff_factor)
        norm = lambda name: LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, cfg.norm_bias,  # noqa: E731
                                      name=name)
        dense = lambda shape_in, shape_out, axes, bias, init, name: Dense(  # noqa: E731
            shape_in, shape_out, axes, use_bias=bias, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=init, name=name)
        h = norm("attn_norm")(x) if self.attn_norm else x
        qkv = dense((cfg.hidden_size,), (3, heads, head_dim), ("embed", None, "heads", "kv"), cfg.attention_bias,
                    init_in, "Wqkv")(h)
        axes = ("batch", "length", "heads", "kv")
        if cfg.global_attn_every_n_layers == 1 or cfg.num_layers == 1:  # every layer global (Cramming's): no local
            is_global = True  # branch to trace, no window for cuDNN
        theta = jnp.where(is_global, cfg.global_rope_theta, cfg.local_rope_theta)
        q = nn.with_logical_constraint(rotary(qkv[:, :, 0], positions, theta), axes)
        k = nn.with_logical_constraint(rotary(qkv[:, :, 1], positions, theta), axes)
        v = nn.with_logical_constraint(qkv[:, :, 2], axes)
        # Either side, or causally back (HF's decoder: q - k < local_attention // 2, so one less back).
        window = cfg.local_attention // 2 - (1 if cfg.causal else 0)
        if isinstance(is_global, (bool, np.bool_)):
            context = Attend(cfg, None if is_global else window, cfg.causal, name="attend")(q, k, v, mask,
                                                                                            deterministic)
        else:
            context = nn.cond(
                is_global,
                lambda mdl, *a: Attend(cfg, None, cfg.causal, name="attend_global")(*a, deterministic),
                lambda mdl, *a: Attend(cfg, window, cfg.causal, name="attend_local")(*a, deterministic),
                self, q, k, v, mask,
            )
        context = nn.with_logical_constraint(context, axes)
        h = dense((heads, head_dim), (cfg.hidden_size,), ("heads", "kv", "embed"), cfg.attention_bias, init_out,
                  "attn_out")(context)
        x = x + nn.Dropout(cfg.attention_dropout_rate)(h, deterministic=deterministic)

        h = dense((cfg.hidden_size,), (2, cfg.intermediate_size), ("embed", None, "mlp"), cfg.mlp_bias, init_in,
                  "Wi")(norm("mlp_norm")(x))
        h = ACTIVATIONS[cfg.hidden_act](h[:, :, 0]) * h[:, :, 1]
        h = nn.with_logical_constraint(h, ("batch", "length", "mlp"))
        h = nn.Dropout(cfg.dropout_rate)(h, deterministic=deterministic)
        h = dense((cfg.intermediate_size,), (cfg.hidden_size,), ("mlp", "embed"), cfg.mlp_bias, init_out, "mlp_out")(h)
        return nn.with_logical_constraint(x + h, ("batch", "length", "embed")), None


class ModernBertEncoder(nn.Module):
    """Embeddings, layer 0, the other layers (scanned or unrolled), the final norm: HF's ModernBertModel."""

    config: ModernBertConfig

    def setup(self):
        cfg = self.config
        norm = lambda: LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, cfg.norm_bias)  # noqa: E731
        self.word = Embed(cfg.vocab_size, cfg.hidden_size, ("vocab", "embed"), cfg.dtype, cfg.param_dtype,
                                    _init(cfg.initializer_range, cfg.initializer_cutoff_factor))
        self.embedding_norm = norm()
        self.final_norm = norm()
        self.embedding_dropout = nn.Dropout(cfg.dropout_rate)
        # Counting self: deterministic is argument 5; unrolled, is_global (4) is a static Python bool too.
        layer = rematerialised(ModernBertLayer, cfg, (5,) if cfg.scan_layers else (4, 5))
        self.first_layer = layer(cfg, attn_norm=False)
        if cfg.scan_layers:
            self.layers = nn.scan(
                layer,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast, 0, nn.broadcast),
                length=cfg.num_layers - 1,
                unroll=cfg.scan_unroll,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )(cfg)
        else:
            self.layers = [layer(cfg, name=f"layers_{n}") for n in range(cfg.num_layers - 1)]

    def __call__(self, input_ids, attention_mask, position_ids=None, segment_ids=None,
                 deterministic: bool = True) -> jax.Array:
        """[batch, length] int inputs -> hidden states [batch, length, hidden] after the final norm.

        Without `position_ids` positions are 0..length-1; packed rows pass positions restarting per document.
        """
        cfg = self.config
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        x = self.embedding_norm(self.word(input_ids))
        x = self.embedding_dropout(x, deterministic=deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        mask = attention_mask_from_batch(attention_mask, segment_ids)
        x, _ = self.first_layer(x, mask, position_ids, cfg.is_global(0), deterministic)
        rest = range(1, cfg.num_layers)
        if cfg.scan_layers:
            is_global = jnp.array([cfg.is_global(i) for i in rest])
            x, _ = self.layers(x, mask, position_ids, is_global, deterministic)
        else:
            for layer, i in zip(self.layers, rest):
                x, _ = layer(x, mask, position_ids, cfg.is_global(i), deterministic)
        return self.final_norm(x)


class ModernBertForMaskedLM(EncoderModel):
    """Encoder + the MLM head at the masked positions: dense, act, norm, decoder tied to the token embedding + bias."""

    config: ModernBertConfig

    def setup(self):
        cfg = self.config
        self.encoder = ModernBertEncoder(cfg)
        init_out = _init(cfg.initializer_range / np.sqrt(2.0 * cfg.num_layers), cfg.initializer_cutoff_factor)
        self.mlm_head = MaskedLMHead(cfg.hidden_size, cfg.vocab_size, cfg.hidden_act, cfg.layer_norm_eps, cfg.dtype,
                                     cfg.param_dtype, init_out, transform_bias=cfg.classifier_bias,
                                     norm_bias=cfg.norm_bias, decoder_bias=cfg.decoder_bias,
                                     transform_name="head_dense", norm_name="head_norm")
        nn.share_scope(self, self.mlm_head)

    def hidden_states(self, batch: dict, deterministic: bool) -> jax.Array:
        """After the final norm; no pooler (HF's task heads pool themselves)."""
        return self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("position_ids"),
                            batch.get("segment_ids"), deterministic)

    def __call__(self, batch: dict, deterministic: bool = True) -> dict:
        """batch: input_ids, attention_mask, masked_positions; optional position_ids, segment_ids (packed rows).

        Returns mlm_logits [batch, predictions, vocab] (float32) and last_hidden_state [batch, length, hidden] (a
        distillation teacher's). `token_type_ids` is ignored. Causal: clm_logits [batch, length, vocab] instead, the
        same head at every position (the batch has no masked_positions).
        """
        hidden = self.hidden_states(batch, deterministic)
        if self.config.causal:
            return {"clm_logits": self.mlm_head(hidden, None, self.encoder.word), "last_hidden_state": hidden}
        logits = self.mlm_head(hidden, batch["masked_positions"], self.encoder.word)
        return {"mlm_logits": logits, "last_hidden_state": hidden}


def build_modernbert(model_cfg) -> nn.Module:
    return ModernBertForMaskedLM(ModernBertConfig.from_config(model_cfg))


def validate_config(config) -> None:
    """The family's checks on the whole config (bert_jax.train.config_validation runs them before compiling)."""
    check_model_config(config.model)
    local, length = config.model.get("local_attention", 128), config.data.max_seq_length
    context = config.mesh.get("context", 1)
    if context > 1 and ModernBertConfig.kernel_choice(config.model).impl == "splash":
        # Splash under the context axis runs global layers over the all-gathered keys (no causal mask: a device's
        # queries start mid-row) and windowed ones by the halo exchange, which needs the window within a shard.
        if is_causal(config.model):
            raise ValueError(f"config.model.attention_impl='splash' at config.mesh.context={context} applies no "
                             f"causal mask to a split sequence (config.model.objective="
                             f"{config.model.get('objective')!r}): use --config.model.attention_impl=xla")
        if has_local_layers(config.model) and local // 2 > length // context:
            raise ValueError(f"config.model.attention_impl='splash' at config.mesh.context={context}: the local "
                             f"window ({local // 2} tokens either side) is wider than a device's {length // context} "
                             f"tokens; use --config.model.attention_impl=xla")
    if local > length:
        raise ValueError(f"config.model.local_attention={local} is larger than the sequence "
                         f"(config.data.max_seq_length={length}): every layer would be global; lower it")
