"""ALBERT (Lan et al. 2020): factorised embeddings, cross-layer parameter sharing, MLM + SOP.

- Embeddings live in a small space E (`embedding_size`, 128) and are projected to the
  hidden size H by `embedding_hidden_mapping_in`: vocab x E + E x H instead of vocab x H.
- `num_hidden_groups` layers' worth of parameters are shared by all `num_layers` layers:
  layer i runs group int(i / (num_layers / num_hidden_groups)), as Hugging Face's
  AlbertTransformer does (one layer per group, i.e. inner_group_num = 1). One linen
  module applied several times shares its parameters; with `scan_layers` the repeats
  of a group run under `nn.scan` with the parameters broadcast, so the parameter tree
  is the same either way.
- The MLM head works in E space (dense H -> E, activation, LayerNorm, decoder tied to the
  E-dim word embeddings); the SOP classifier sits on the pooled [CLS].
- The activation is `hidden_act`: Hugging Face's ALBERT default, and albert-*-v2's, is
  "gelu_new" (the tanh approximation); "gelu" is the exact one (albert-*-v1).
"""
import collections
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.attention import AttentionMask, attention_mask_from_batch
from bert_jax.models.bert import BertConfig
from bert_jax.models.layers import Dense, Embed, EncoderModel, LayerNorm, MaskedLMHead
from bert_jax.models.transformer import TransformerLayer, rematerialised

@dataclasses.dataclass(frozen=True)
class AlbertConfig(BertConfig):
    vocab_size: int = 30000
    embedding_size: int = 128
    num_hidden_groups: int = 1
    hidden_act: str = "gelu_new"
    pad_token_id: int = 0

    def __post_init__(self):
        if not 1 <= self.num_hidden_groups <= self.num_layers:
            raise ValueError(f"config.model.num_hidden_groups={self.num_hidden_groups} must be in "
                             f"[1, config.model.num_layers={self.num_layers}]")


def group_repeats(num_layers: int, num_groups: int) -> list[int]:
    """How many consecutive layers each parameter group runs, by Hugging Face's rule
    group(i) = int(i / (num_layers / num_groups)); e.g. 12 layers, 1 group -> [12]."""
    counts = collections.Counter(int(i / (num_layers / num_groups)) for i in range(num_layers))
    return [counts[g] for g in range(num_groups)]


class AlbertEmbeddings(nn.Module):
    """Word + position + token-type embeddings of size E, LayerNorm, dropout."""

    config: AlbertConfig

    def setup(self):
        cfg = self.config
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                  embedding_init=nn.initializers.normal(cfg.initializer_range))
        self.word = Embed(cfg.vocab_size, cfg.embedding_size, ("vocab", "embed"), **kw)
        self.position = Embed(cfg.max_position_embeddings, cfg.embedding_size, (None, "embed"), **kw)
        self.token_type = Embed(cfg.type_vocab_size, cfg.embedding_size, (None, "embed"), **kw)
        self.norm = LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype)
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
        x = self.word(input_ids) + self.position(position_ids) + self.token_type(token_type_ids)
        return self.dropout(self.norm(x), deterministic=deterministic)


class SharedLayerStack(nn.Module):
    """`num_layers` layers drawn from `num_hidden_groups` parameter groups (`group_0`, ...)."""

    config: AlbertConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: AttentionMask, deterministic: bool) -> jax.Array:
        cfg = self.config
        layer = TransformerLayer  # BERT's layer: Hugging Face's AlbertLayer is the same maths
        layer = rematerialised(layer, cfg, (3,))
        for group, repeats in enumerate(group_repeats(cfg.num_layers, cfg.num_hidden_groups)):
            if cfg.scan_layers:
                # Parameters broadcast (not stacked): every repeat reads the group's one copy.
                scanned = nn.scan(layer, variable_broadcast="params", variable_axes={"intermediates": 0},
                                  split_rngs={"params": False, "dropout": True},
                                  in_axes=(nn.broadcast, nn.broadcast), length=repeats, unroll=cfg.scan_unroll)
                x, _ = scanned(cfg, name=f"group_{group}")(x, mask, deterministic)
            else:
                shared = layer(cfg, name=f"group_{group}")
                for _ in range(repeats):
                    x, _ = shared(x, mask, deterministic)
        return x


class AlbertEncoder(nn.Module):
    """Embeddings (E), the E -> H projection and the shared stack: what ALBERT task heads sit on."""

    config: AlbertConfig

    def setup(self):
        cfg = self.config
        self.embeddings = AlbertEmbeddings(cfg)
        self.embedding_hidden_mapping_in = Dense(
            (cfg.embedding_size,), (cfg.hidden_size,), (None, "embed"), dtype=cfg.dtype,
            param_dtype=cfg.param_dtype, kernel_init=nn.initializers.normal(cfg.initializer_range),
        )
        self.stack = SharedLayerStack(cfg)

    def __call__(self, input_ids, attention_mask, token_type_ids=None, position_ids=None,
                 segment_ids=None, deterministic: bool = True) -> jax.Array:
        """[batch, length] int inputs -> hidden states [batch, length, hidden]; as BertEncoder."""
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        x = self.embedding_hidden_mapping_in(self.embeddings(input_ids, token_type_ids, position_ids, deterministic))
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        return self.stack(x, attention_mask_from_batch(attention_mask, segment_ids), deterministic)


class AlbertForPreTraining(EncoderModel):
    """Encoder + MLM head in E space (gathered at the masked positions) + SOP head on the pooled [CLS]."""

    config: AlbertConfig

    def setup(self):
        cfg = self.config
        init = nn.initializers.normal(cfg.initializer_range)
        self.encoder = AlbertEncoder(cfg)
        self.mlm_head = MaskedLMHead(cfg.embedding_size, cfg.vocab_size, cfg.hidden_act, cfg.layer_norm_eps,
                                     cfg.dtype, cfg.param_dtype, init)
        nn.share_scope(self, self.mlm_head)
        dense = lambda shape_out: Dense(  # noqa: E731
            (cfg.hidden_size,), shape_out, ("embed", None), dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=init)
        self.pooler = dense((cfg.hidden_size,))
        self.sop = dense((2,))
        self.sop_dropout = nn.Dropout(cfg.dropout_rate)

    def hidden_states(self, batch: dict, deterministic: bool) -> jax.Array:
        return self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                            batch.get("position_ids"), batch.get("segment_ids"), deterministic)

    def __call__(self, batch: dict, deterministic: bool = True) -> dict:
        """batch: the pipeline's dict. Returns mlm_logits [batch, predictions, vocab] and sop_logits [batch, 2],
        both float32, and last_hidden_state [batch, length, hidden] (a distillation teacher's)."""
        hidden = self.hidden_states(batch, deterministic)
        logits = self.mlm_head(hidden, batch["masked_positions"], self.encoder.embeddings.word)
        pooled = self.sop_dropout(self.pool(hidden[:, 0]), deterministic=deterministic)
        return {"mlm_logits": logits, "sop_logits": self.sop(pooled).astype(jnp.float32),
                "last_hidden_state": hidden}


def build_albert(model_cfg) -> nn.Module:
    return AlbertForPreTraining(AlbertConfig.from_config(model_cfg))
