"""DeBERTa-v3 (He et al. 2023): BERT's post-LN encoder with disentangled attention, following
transformers' DebertaV2 so that weights move both ways.

What differs from BERT:
- no absolute position embeddings in the input (`position_biased_input=False`): positions
  enter only through the relative-position embeddings of every attention layer
  (models/disentangled_attention.py), 2 * position_buckets rows shared by all layers and
  LayerNorm-ed once (`norm_rel_ebd="layer_norm"`);
- no token types (`type_vocab_size=0`), embedding_size == hidden_size, no conv layer;
- the MLM head is DebertaV2ForMaskedLM's legacy one (dense, GELU, LayerNorm, tied decoder +
  bias), run at the gathered masked positions as every family's.

The family (`DebertaV3`) trains by replaced-token detection (models/replaced_token_detection.py):
a generator of the same width and `generator_num_layers` layers (half the discriminator's by
default, as DeBERTa-v3 does) and the discriminator, whose word table is the generator's behind a
stop-gradient plus its own zero-initialised delta (GDES, He et al. 2023 §3.2). The discriminator's
head is the original code's `LMMaskPredictionHead` (released checkpoints hold it as
`mask_predictions`): LayerNorm(h + h_[CLS]), dense, activation, a one-unit classifier.
`DebertaV3ForMaskedLM` alone is DebertaV2ForMaskedLM (the generator, and the parity reference).
"""
import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.attention import AttentionMask, KernelChoice, attention_mask_from_batch, choose_kernel
from bert_jax.models.bert import BertConfig
from bert_jax.models.disentangled_attention import FUSED_KERNEL, DisentangledSelfAttention
from bert_jax.models.layers import ACTIVATIONS, Dense, Embed, EncoderModel, LayerNorm, MaskedLMHead
from bert_jax.models.replaced_token_detection import GradientDisentangledEmbed, ReplacedTokenDetection
from bert_jax.models.transformer import rematerialised


@dataclasses.dataclass(frozen=True)
class DebertaV3Config(BertConfig):
    vocab_size: int = 128100
    type_vocab_size: int = 0
    layer_norm_eps: float = 1e-7
    # Relative distances up to +-position_buckets/2 are exact, longer ones log-bucketed up to
    # max_relative_positions (DeBERTa-v3: 256 and 512).
    position_buckets: int = 256
    max_relative_positions: int = 512
    pad_token_id: int = 0
    # Replaced-token detection: the generator's depth (0: half the discriminator's) and the
    # temperature of its softmax when sampling replacements.
    generator_num_layers: int = 0
    sampling_temperature: float = 1.0

    @classmethod
    def from_config(cls, model_cfg) -> "DebertaV3Config":
        """Also fails, naming the key, on relative-position settings or a kernel this family cannot use."""
        get = model_cfg.get
        buckets, max_relative = get("position_buckets", 256), get("max_relative_positions", 512)
        if not 0 < buckets <= max_relative:
            raise ValueError(f"config.model.position_buckets={buckets} must be in (0, config.model."
                             f"max_relative_positions={max_relative}]: buckets beyond the largest distance "
                             f"are never used")
        if buckets % 2 or buckets < 4:
            raise ValueError(f"config.model.position_buckets={buckets} must be even and >= 4 (half of them "
                             f"hold exact distances either side)")
        impl = get("attention_impl", "auto")
        if impl in ("cudnn", "triton"):
            kernel = "cuDNN" if impl == "cudnn" else "the windowed Triton kernel"
            raise ValueError(f"config.model.attention_impl={impl!r}: disentangled attention adds position terms to "
                             f"the scores, which {kernel} cannot; use 'xla' or 'auto' (or 'splash', the fused Pallas "
                             "kernel, on TPU)")
        cfg = super().from_config(model_cfg)
        generator_layers = cfg.generator_num_layers or max(1, cfg.num_layers // 2)
        if not 1 <= generator_layers <= cfg.num_layers:
            raise ValueError(f"config.model.generator_num_layers={cfg.generator_num_layers}: the generator must be "
                             f"no deeper than the discriminator (1 to config.model.num_layers={cfg.num_layers}; "
                             f"DeBERTa-v3 uses half)")
        if not cfg.sampling_temperature > 0:
            raise ValueError(f"config.model.sampling_temperature={cfg.sampling_temperature} must be > 0")
        # 'auto' resolved for the target: on TPU (splash) this family runs its own fused kernel, elsewhere xla
        # (cuDNN takes no score terms).
        impl = FUSED_KERNEL if cfg.attention_impl == "splash" else "xla"
        return dataclasses.replace(cfg, attention_impl=impl, generator_num_layers=generator_layers)

    @classmethod
    def kernel_choice(cls, model_cfg) -> KernelChoice:
        """As every family's, but its TPU kernel drops attention probabilities itself (the recipe's 0.1)."""
        return choose_kernel(model_cfg, drops_in_kernel=True)

    def generator_config(self) -> "DebertaV3Config":
        """The generator: the discriminator's width (GDES shares one table), generator_num_layers deep."""
        return dataclasses.replace(self, num_layers=self.generator_num_layers)


class DebertaLayer(nn.Module):
    """Post-LN as BERT's TransformerLayer (same parameter names), with disentangled attention."""

    config: Any

    @nn.compact
    def __call__(self, x: jax.Array, rel_embeddings: jax.Array, mask: AttentionMask, deterministic: bool):
        cfg = self.config
        dropout = nn.Dropout(cfg.dropout_rate)
        dense = lambda shape_in, shape_out, axes, name: Dense(  # noqa: E731
            shape_in, shape_out, axes, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=nn.initializers.normal(cfg.initializer_range), name=name,
        )
        norm = lambda name: LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype, name=name)  # noqa: E731
        h = DisentangledSelfAttention(cfg, name="attention")(x, rel_embeddings, mask, deterministic)
        x = norm("attention_norm")(x + dropout(h, deterministic=deterministic))
        h = dense((cfg.hidden_size,), (cfg.intermediate_size,), ("embed", "mlp"), "intermediate")(x)
        h = nn.with_logical_constraint(ACTIVATIONS[cfg.hidden_act](h), ("batch", "length", "mlp"))
        h = dense((cfg.intermediate_size,), (cfg.hidden_size,), ("mlp", "embed"), "mlp_output")(h)
        x = norm("mlp_norm")(x + dropout(h, deterministic=deterministic))
        return nn.with_logical_constraint(x, ("batch", "length", "embed")), None


class DebertaStack(nn.Module):
    """`num_layers` DebertaLayers, scanned or unrolled (as TransformerStack), all reading one relative table."""

    config: Any

    @nn.compact
    def __call__(self, x, rel_embeddings, mask: AttentionMask, deterministic: bool) -> jax.Array:
        cfg = self.config
        layer = DebertaLayer
        layer = rematerialised(layer, cfg, (4,))
        if cfg.scan_layers:
            stack = nn.scan(
                layer, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast, nn.broadcast), length=cfg.num_layers,
                unroll=cfg.scan_unroll, metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = stack(cfg, name="layers")(x, rel_embeddings, mask, deterministic)
            return x
        for i in range(cfg.num_layers):
            x, _ = layer(cfg, name=f"layers_{i}")(x, rel_embeddings, mask, deterministic)
        return x


class DebertaEncoder(nn.Module):
    """Word embeddings (+ token types when type_vocab_size > 0), LayerNorm, the relative table, the stack.

    `shared_word`, when given, is the word table to use instead of one of its own: anything with
    Embed's `__call__(ids)` and `attend(x)`, e.g. a table derived from another network's (GDES).
    """

    config: DebertaV3Config
    shared_word: nn.Module | None = None

    def setup(self):
        cfg = self.config
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                  embedding_init=nn.initializers.normal(cfg.initializer_range))
        if self.shared_word is None:
            self.word = Embed(cfg.vocab_size, cfg.hidden_size, ("vocab", "embed"), **kw)
        if cfg.type_vocab_size > 0:
            self.token_type = Embed(cfg.type_vocab_size, cfg.hidden_size, (None, "embed"), **kw)
        self.embedding_norm = LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype)
        self.rel_embeddings = Embed(2 * cfg.position_buckets, cfg.hidden_size, (None, "embed"), **kw)
        self.rel_norm = LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype)
        self.dropout = nn.Dropout(cfg.dropout_rate)
        self.stack = DebertaStack(cfg)

    def word_embeddings(self) -> nn.Module:
        """The word table this encoder reads, which a tied MLM head decodes against."""
        return self.word if self.shared_word is None else self.shared_word

    def __call__(self, input_ids, attention_mask, token_type_ids=None, segment_ids=None,
                 deterministic: bool = True) -> jax.Array:
        """input_ids, attention_mask, token_type_ids, segment_ids: [batch, length] int -> [batch, length, hidden]."""
        x = self.word_embeddings()(input_ids)
        if self.config.type_vocab_size > 0:
            x = x + self.token_type(jnp.zeros_like(input_ids) if token_type_ids is None else token_type_ids)
        x = self.dropout(self.embedding_norm(x), deterministic=deterministic)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        rel = self.rel_norm(self.rel_embeddings.embedding.astype(self.config.dtype))
        return self.stack(x, rel, attention_mask_from_batch(attention_mask, segment_ids), deterministic)


class DebertaV3ForMaskedLM(EncoderModel):
    """Encoder + DebertaV2ForMaskedLM's (legacy) head at the masked positions. Head parameter names are
    BERT's (`mlm_transform`, `mlm_norm`, `mlm_output_bias`)."""

    config: DebertaV3Config
    shared_word: nn.Module | None = None  # see DebertaEncoder

    def setup(self):
        cfg = self.config
        self.encoder = DebertaEncoder(cfg, self.shared_word)
        self.mlm_head = MaskedLMHead(cfg.hidden_size, cfg.vocab_size, cfg.hidden_act, cfg.layer_norm_eps, cfg.dtype,
                                     cfg.param_dtype, nn.initializers.normal(cfg.initializer_range))
        nn.share_scope(self, self.mlm_head)

    def hidden_states(self, batch: dict, deterministic: bool) -> jax.Array:
        return self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                            batch.get("segment_ids"), deterministic)

    def __call__(self, batch: dict, deterministic: bool = True) -> dict:
        """batch: input_ids, attention_mask, masked_positions [batch, ...]; optional token_type_ids, segment_ids.

        Returns mlm_logits [batch, predictions, vocab] (float32).
        """
        hidden = self.hidden_states(batch, deterministic)
        return {"mlm_logits": self.mlm_head(hidden, batch["masked_positions"], self.encoder.word_embeddings())}


class DebertaV3Discriminator(nn.Module):
    """Encoder + the replaced-token head on every token: logits [batch, length], > 0 = replaced."""

    config: DebertaV3Config
    shared_word: nn.Module | None = None

    def setup(self):
        cfg = self.config
        dense = lambda features: Dense(  # noqa: E731
            (cfg.hidden_size,), (features,), ("embed", None), dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=nn.initializers.normal(cfg.initializer_range))
        self.encoder = DebertaEncoder(cfg, self.shared_word)
        self.rtd_norm = LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype)
        self.rtd_transform = dense(cfg.hidden_size)
        self.rtd_output = dense(1)

    def __call__(self, batch: dict, deterministic: bool) -> jax.Array:
        hidden = self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                              batch.get("segment_ids"), deterministic)
        h = self.rtd_norm(hidden + hidden[:, :1])  # every token next to [CLS], as LMMaskPredictionHead
        h = ACTIVATIONS[self.config.hidden_act](self.rtd_transform(h))
        return self.rtd_output(h)[..., 0].astype(jnp.float32)


class DebertaV3(ReplacedTokenDetection):
    """DeBERTa-v3 pre-training: generator + discriminator with gradient-disentangled embedding sharing.

    `word` is the generator's table; the discriminator reads stop_gradient(word) + `discriminator_word`'s
    delta, so its loss trains the delta and never the shared table (what a checkpoint holds is the sum).
    """

    config: DebertaV3Config = None

    def setup(self):
        cfg = self.config
        self.word = Embed(cfg.vocab_size, cfg.hidden_size, ("vocab", "embed"), dtype=cfg.dtype,
                          param_dtype=cfg.param_dtype, embedding_init=nn.initializers.normal(cfg.initializer_range))
        self.discriminator_word = GradientDisentangledEmbed(self.word)
        self.generator = DebertaV3ForMaskedLM(cfg.generator_config(), self.word)
        self.discriminator = DebertaV3Discriminator(cfg, self.discriminator_word)

    def sampling_temperature(self) -> float:
        return self.config.sampling_temperature

    def generator_logits(self, batch: dict, deterministic: bool = True) -> jax.Array:
        return self.generator(batch, deterministic)["mlm_logits"]

    def hidden_states(self, batch: dict, deterministic: bool) -> jax.Array:
        """The discriminator's encoder, reading the GDES-merged word table (what a released DeBERTa-v3 is and
        fine-tuning starts from); no pooler (HF's ContextPooler is a task head's). The stop-gradient stays:
        fine-tuning moves the merged table through its delta alone."""
        return self.discriminator.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                                          batch.get("segment_ids"), deterministic)

    def discriminator_logits(self, batch: dict, deterministic: bool = True) -> jax.Array:
        return self.discriminator(batch, deterministic)


def build_deberta_v3_mlm(model_cfg) -> nn.Module:
    """DebertaV2ForMaskedLM alone (no generator): the parity reference, and an MLM model of its own."""
    return DebertaV3ForMaskedLM(DebertaV3Config.from_config(model_cfg))


def build_deberta_v3(model_cfg) -> nn.Module:
    return DebertaV3(config=DebertaV3Config.from_config(model_cfg))
