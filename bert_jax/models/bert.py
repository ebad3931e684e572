"""BERT (Devlin et al. 2019): embeddings, the post-LN encoder, and the MLM + NSP heads."""
import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.attention import KernelChoice, attention_mask_from_batch, choose_kernel
from bert_jax.models import parametrization
from bert_jax.models.layers import ACTIVATIONS, Dense, Embed, EncoderModel, LayerNorm, MaskedLMHead
from bert_jax.models.transformer import REMAT_CHOICES, TransformerStack, layers_per_iteration

DROPOUT_MASKS = ("per_layer", "per_step")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """The model's hyper-parameters, frozen and hashable (Flax modules and `nn.scan` need that)."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.0
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    hidden_act: str = "gelu"  # a key of layers.ACTIVATIONS
    scan_layers: bool = True
    # Layers per iteration of the scanned loop (nn.scan's unroll; >= the loop's length unrolls it whole, which
    # the TPU planner does to count every layer's FLOPs and bytes, bert_jax/plan/compiled_plan.py). from_config
    # resolves config.model.unroll_on_gpu for the platform (transformer.layers_per_iteration).
    scan_unroll: int = 1
    remat_policy: str = "none"
    # Hidden dropout's masks: per_layer (drawn in each layer) | per_step (all layers' at once; models/transformer.py)
    dropout_masks: str = "per_layer"
    # Post-LN's LayerNorm(x + dropout(h)) as one custom VJP that re-draws the mask in the backward
    # (bert_jax/kernels/dropout_add_layer_norm.py): the same values, gradients and masks, no mask kept.
    fused_dropout_norm: bool = False
    # query, key and value as one matmul against their kernels side by side (models/attention.py); same parameters.
    fused_qkv: bool = False
    # A kernel of models.attention: xla | cudnn | splash; from_config resolves "auto" for this platform.
    attention_impl: str = "xla"
    splash_interpret: bool = False
    # The attention logits' factor beyond 1/sqrt(head_dim): μP's (bert_jax/models/parametrization.py), 1 under
    # standard; from_config derives it from config.model.parametrization and mup_base_width.
    attention_multiplier: float = 1.0
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @classmethod
    def from_config(cls, model_cfg) -> "BertConfig":
        """Builds from `config.model`; keys this dataclass does not know (e.g. `family`) are ignored."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in model_cfg.items() if k in fields}
        for key in ("dtype", "param_dtype"):
            if key in values:
                if values[key] not in DTYPES:
                    raise ValueError(f"config.model.{key}={values[key]!r}; expected one of {sorted(DTYPES)}")
                values[key] = DTYPES[values[key]]
        if values.get("hidden_act", "gelu") not in ACTIVATIONS:
            raise ValueError(
                f"config.model.hidden_act={values['hidden_act']!r}; expected one of {sorted(ACTIVATIONS)}"
            )
        if values.get("remat_policy", "none") not in REMAT_CHOICES:
            raise ValueError(
                f"config.model.remat_policy={values['remat_policy']!r}; expected one of {sorted(REMAT_CHOICES)}"
            )
        if values.get("dropout_masks", "per_layer") not in DROPOUT_MASKS:
            raise ValueError(f"config.model.dropout_masks={values['dropout_masks']!r}; expected one of "
                             f"{', '.join(DROPOUT_MASKS)}")
        # Resolved here, as the model is built and before anything compiles: a kernel this platform
        # cannot run (or that cannot apply the configured dropout) fails naming the key.
        values["attention_impl"] = cls.kernel_choice(model_cfg).impl
        values["attention_multiplier"] = parametrization.attention_multiplier(model_cfg)
        values["scan_unroll"] = layers_per_iteration(model_cfg)
        return cls(**values)

    @classmethod
    def kernel_choice(cls, model_cfg) -> KernelChoice:
        """The attention kernel `config.model` resolves to for this model (the family registry's too)."""
        return choose_kernel(model_cfg)


class BertEmbeddings(nn.Module):
    """Word + position + token-type embeddings, LayerNorm, dropout."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        init = nn.initializers.normal(cfg.initializer_range)
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype, embedding_init=init)
        self.word = Embed(cfg.vocab_size, cfg.hidden_size, ("vocab", "embed"), **kw)
        self.position = Embed(cfg.max_position_embeddings, cfg.hidden_size, (None, "embed"), **kw)
        self.token_type = Embed(cfg.type_vocab_size, cfg.hidden_size, (None, "embed"), **kw)
        self.norm = LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype)
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def __call__(self, input_ids, token_type_ids, position_ids, deterministic: bool):
        x = self.word(input_ids) + self.position(position_ids) + self.token_type(token_type_ids)
        x = self.dropout(self.norm(x), deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class BertEncoder(nn.Module):
    """Embeddings + transformer stack: the part every BERT-style task head sits on."""

    config: BertConfig

    def setup(self):
        self.embeddings = BertEmbeddings(self.config)
        self.stack = TransformerStack(self.config)

    def __call__(self, input_ids, attention_mask, token_type_ids=None, position_ids=None,
                 segment_ids=None, deterministic: bool = True) -> jax.Array:
        """input_ids, attention_mask, token_type_ids, position_ids, segment_ids: [batch, length] int.

        Returns hidden states [batch, length, hidden]. Without `position_ids`
        positions are 0..length-1; packed batches pass positions that restart per document.
        """
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        x = self.embeddings(input_ids, token_type_ids, position_ids, deterministic)
        return self.stack(x, attention_mask_from_batch(attention_mask, segment_ids), deterministic)


class BertForPreTraining(EncoderModel):
    """Encoder + MLM head (only at the masked positions) + NSP head on the pooled [CLS]."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        init = nn.initializers.normal(cfg.initializer_range)
        self.encoder = BertEncoder(cfg)
        # BERT's head uses the exact GELU whatever hidden_act says, as Hugging Face's BertLMPredictionHead.
        self.mlm_head = MaskedLMHead(cfg.hidden_size, cfg.vocab_size, "gelu", cfg.layer_norm_eps, cfg.dtype,
                                     cfg.param_dtype, init)
        nn.share_scope(self, self.mlm_head)
        dense = lambda shape_out, name: Dense(  # noqa: E731
            (cfg.hidden_size,), shape_out, ("embed", None), dtype=cfg.dtype, param_dtype=cfg.param_dtype,
            kernel_init=init, name=name)
        self.pooler = dense((cfg.hidden_size,), "pooler")
        self.nsp = dense((2,), "nsp")

    def hidden_states(self, batch: dict, deterministic: bool) -> jax.Array:
        return self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                            batch.get("position_ids"), batch.get("segment_ids"), deterministic)

    def __call__(self, batch: dict, deterministic: bool = True) -> dict:
        """batch: the pipeline's dict (input_ids, attention_mask, token_type_ids, masked_positions, ...).

        Returns mlm_logits [batch, predictions, vocab] (float32) and nsp_logits [batch, 2]; last_hidden_state
        [batch, length, hidden] for distillation (unused outputs cost nothing under jit).
        """
        hidden = self.hidden_states(batch, deterministic)
        logits = self.mlm_head(hidden, batch["masked_positions"], self.encoder.embeddings.word)
        return {"mlm_logits": logits, "nsp_logits": self.nsp(self.pool(hidden[:, 0])).astype(jnp.float32),
                "last_hidden_state": hidden}


def build_bert(model_cfg) -> nn.Module:
    return BertForPreTraining(BertConfig.from_config(model_cfg))
