"""ELECTRA (Clark et al. 2020): a small generator and a discriminator trained together by replaced-token detection.

- Both are BERT's post-LN encoder behind factorised embeddings: tables of `embedding_size` E,
  projected to the network's hidden size by `embeddings_project` where the two differ (as
  Hugging Face's ElectraModel does; base and large have E = H, so no projection).
- The generator is the discriminator scaled by `generator_size_ratio` in hidden size, heads and
  FFN size, with the same depth (§3.2 and Table 7: 1/4 for small and large, 1/3 for base);
  a ratio above 1, or one that leaves a fraction of a head or of a unit, fails naming the key.
- Token, position and type embeddings (with their LayerNorm) are one module both networks use
  (§3.2, "we share the embeddings"): the original code shares the whole `embeddings` scope.
- Generator head (Hugging Face's ElectraGeneratorPredictions): dense H_g -> E, exact GELU,
  LayerNorm, the decoder tied to the word table, plus a bias; at the gathered masked positions.
- Discriminator head (ElectraDiscriminatorPredictions): dense H -> H, `hidden_act`, dense H -> 1.
"""
import dataclasses
import fractions

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.albert import AlbertEmbeddings
from bert_jax.models.attention import attention_mask_from_batch
from bert_jax.models.bert import BertConfig
from bert_jax.models.layers import ACTIVATIONS, Dense, MaskedLMHead
from bert_jax.models.replaced_token_detection import ReplacedTokenDetection
from bert_jax.models.transformer import TransformerStack


@dataclasses.dataclass(frozen=True)
class ElectraConfig(BertConfig):
    """The discriminator's sizes; the generator's come from `generator_config()`."""

    embedding_size: int = 768
    generator_size_ratio: float = 1 / 3
    sampling_temperature: float = 1.0
    pad_token_id: int = 0

    def __post_init__(self):
        ratio = self.generator_ratio()
        if not 0 < ratio <= 1:
            raise ValueError(f"config.model.generator_size_ratio={self.generator_size_ratio}: the generator must be "
                             f"no larger than the discriminator (a ratio in (0, 1]; the paper uses 1/4 to 1/3)")
        for key in ("num_heads", "hidden_size", "intermediate_size"):
            scaled = getattr(self, key) * ratio
            if scaled.denominator != 1:
                raise ValueError(
                    f"config.model.generator_size_ratio={self.generator_size_ratio} gives the generator "
                    f"{float(scaled):g} of config.model.{key}={getattr(self, key)}: pick a ratio that divides it "
                    f"evenly (e.g. 1/4 for 4 heads)")
        if not self.sampling_temperature > 0:
            raise ValueError(f"config.model.sampling_temperature={self.sampling_temperature} must be > 0")

    def generator_ratio(self) -> fractions.Fraction:
        # 1/3 arrives as 0.333...; the nearest small fraction is what was meant.
        return fractions.Fraction(self.generator_size_ratio).limit_denominator(64)

    def generator_config(self) -> BertConfig:
        """The generator's sizes: hidden, heads and FFN scaled by the ratio; everything else shared."""
        ratio = self.generator_ratio()
        scale = lambda key: int(getattr(self, key) * ratio)  # noqa: E731
        return dataclasses.replace(self, hidden_size=scale("hidden_size"), num_heads=scale("num_heads"),
                                   intermediate_size=scale("intermediate_size"), generator_size_ratio=1.0)


class ElectraEncoder(nn.Module):
    """The (shared) embeddings, the E -> H projection where E != H, and the post-LN stack."""

    config: ElectraConfig
    embeddings: nn.Module

    def setup(self):
        cfg = self.config
        if cfg.embedding_size != cfg.hidden_size:
            self.embeddings_project = Dense(
                (cfg.embedding_size,), (cfg.hidden_size,), (None, "embed"), dtype=cfg.dtype,
                param_dtype=cfg.param_dtype, kernel_init=nn.initializers.normal(cfg.initializer_range),
            )
        self.stack = TransformerStack(cfg)

    def __call__(self, batch: dict, deterministic: bool) -> jax.Array:
        """batch: input_ids, attention_mask, [token_type_ids, position_ids, segment_ids] -> [batch, length, H]."""
        input_ids = batch["input_ids"]
        token_type_ids = batch.get("token_type_ids")
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        position_ids = batch.get("position_ids")
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        x = self.embeddings(input_ids, token_type_ids, position_ids, deterministic)
        if self.config.embedding_size != self.config.hidden_size:
            x = self.embeddings_project(x)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        mask = attention_mask_from_batch(batch["attention_mask"], batch.get("segment_ids"))
        return self.stack(x, mask, deterministic)


def _dense(cfg, shape_in, shape_out, axes, name=None):
    return Dense(shape_in, shape_out, axes, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                 kernel_init=nn.initializers.normal(cfg.initializer_range), name=name)


class ElectraGenerator(nn.Module):
    """Encoder + MLM head in E space, tied to the shared word table: Hugging Face's ElectraForMaskedLM."""

    config: BertConfig  # ElectraConfig.generator_config()
    embeddings: nn.Module

    def setup(self):
        cfg = self.config
        self.encoder = ElectraEncoder(cfg, self.embeddings)
        # Hugging Face's generator head always uses the exact GELU, whatever hidden_act says.
        self.mlm_head = MaskedLMHead(cfg.embedding_size, cfg.vocab_size, "gelu", cfg.layer_norm_eps, cfg.dtype,
                                     cfg.param_dtype, nn.initializers.normal(cfg.initializer_range))
        nn.share_scope(self, self.mlm_head)

    def __call__(self, batch: dict, deterministic: bool) -> jax.Array:
        """-> float32 logits [batch, predictions, vocab] at batch["masked_positions"]."""
        return self.mlm_head(self.encoder(batch, deterministic), batch["masked_positions"], self.embeddings.word)


class ElectraDiscriminator(nn.Module):
    """Encoder + per-token replaced/original head: Hugging Face's ElectraForPreTraining."""

    config: ElectraConfig
    embeddings: nn.Module

    def setup(self):
        cfg = self.config
        self.encoder = ElectraEncoder(cfg, self.embeddings)
        self.rtd_transform = _dense(cfg, (cfg.hidden_size,), (cfg.hidden_size,), ("embed", None))
        self.rtd_output = _dense(cfg, (cfg.hidden_size,), (1,), ("embed", None))

    def __call__(self, batch: dict, deterministic: bool) -> jax.Array:
        """-> float32 logits [batch, length]; > 0 = replaced."""
        h = ACTIVATIONS[self.config.hidden_act](self.rtd_transform(self.encoder(batch, deterministic)))
        return self.rtd_output(h)[..., 0].astype(jnp.float32)


class Electra(ReplacedTokenDetection):
    """Generator + discriminator over one embedding module; the forward is ReplacedTokenDetection's."""

    config: ElectraConfig = None

    def setup(self):
        cfg = self.config
        self.embeddings = AlbertEmbeddings(cfg)  # word + position + type in E, LayerNorm, dropout
        self.generator = ElectraGenerator(cfg.generator_config(), self.embeddings)
        self.discriminator = ElectraDiscriminator(cfg, self.embeddings)

    def sampling_temperature(self) -> float:
        return self.config.sampling_temperature

    def generator_logits(self, batch: dict, deterministic: bool = True) -> jax.Array:
        return self.generator(batch, deterministic)

    def hidden_states(self, batch: dict, deterministic: bool) -> jax.Array:
        """The discriminator's encoder (shared embeddings included), which fine-tuning starts from as
        ElectraForSequenceClassification does; no pooler."""
        return self.discriminator.encoder(batch, deterministic)

    def discriminator_logits(self, batch: dict, deterministic: bool = True) -> jax.Array:
        return self.discriminator(batch, deterministic)


def build_electra(model_cfg) -> nn.Module:
    return Electra(config=ElectraConfig.from_config(model_cfg))
