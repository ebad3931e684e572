"""DistilBERT (Sanh et al. 2019): BERT's post-LN encoder without token types or pooler, trained with MLM.

What differs from BERT, and why it matters for Hugging Face parity:
- embeddings are word + position only (no token-type table), then LayerNorm and dropout;
  `token_type_ids` in a batch is ignored;
- no pooler and no NSP: the model is DistilBertForMaskedLM's (encoder + vocab_transform,
  activation, vocab_layer_norm, vocab_projector tied to the word embeddings);
- every LayerNorm has epsilon 1e-12 (hard-wired in transformers).

The parameter tree uses BERT's names (`encoder/embeddings/word`, `encoder/stack/layers_i`,
`mlm_transform`, `mlm_norm`, `mlm_output_bias`), so a BERT or RoBERTa teacher's embeddings
and layers copy straight into a DistilBERT student (bert_jax/train/teacher.py).
The outputs add `last_hidden_state`, which distillation's cosine loss compares.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.attention import attention_mask_from_batch
from bert_jax.models.bert import BertConfig
from bert_jax.models.layers import Embed, EncoderModel, LayerNorm, MaskedLMHead
from bert_jax.models.transformer import TransformerStack


class DistilBertEmbeddings(nn.Module):
    """Word + position embeddings, LayerNorm, dropout."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        kw = dict(dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                  embedding_init=nn.initializers.normal(cfg.initializer_range))
        self.word = Embed(cfg.vocab_size, cfg.hidden_size, ("vocab", "embed"), **kw)
        self.position = Embed(cfg.max_position_embeddings, cfg.hidden_size, (None, "embed"), **kw)
        self.norm = LayerNorm(cfg.layer_norm_eps, cfg.dtype, cfg.param_dtype)
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def __call__(self, input_ids, position_ids, deterministic: bool):
        x = self.word(input_ids) + self.position(position_ids)
        x = self.dropout(self.norm(x), deterministic=deterministic)
        return nn.with_logical_constraint(x, ("batch", "length", "embed"))


class DistilBertEncoder(nn.Module):
    config: BertConfig

    def setup(self):
        self.embeddings = DistilBertEmbeddings(self.config)
        self.stack = TransformerStack(self.config)

    def __call__(self, input_ids, attention_mask, position_ids=None, segment_ids=None,
                 deterministic: bool = True) -> jax.Array:
        """[batch, length] int inputs -> hidden states [batch, length, hidden]; positions default to 0..length-1."""
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1]), input_ids.shape)
        x = self.embeddings(input_ids, position_ids, deterministic)
        return self.stack(x, attention_mask_from_batch(attention_mask, segment_ids), deterministic)


class DistilBertForMaskedLM(EncoderModel):
    """Encoder + the MLM head at the masked positions (dense, activation, LayerNorm, tied decoder, bias). No pooler:
    DistilBertForSequenceClassification's pre_classifier is a task head's."""

    config: BertConfig

    def setup(self):
        cfg = self.config
        self.encoder = DistilBertEncoder(cfg)
        self.mlm_head = MaskedLMHead(cfg.hidden_size, cfg.vocab_size, cfg.hidden_act, cfg.layer_norm_eps, cfg.dtype,
                                     cfg.param_dtype, nn.initializers.normal(cfg.initializer_range))
        nn.share_scope(self, self.mlm_head)

    def hidden_states(self, batch: dict, deterministic: bool) -> jax.Array:
        return self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("position_ids"),
                            batch.get("segment_ids"), deterministic)

    def __call__(self, batch: dict, deterministic: bool = True) -> dict:
        """batch: input_ids, attention_mask, masked_positions; optional position_ids, segment_ids.

        Returns mlm_logits [batch, predictions, vocab] (float32) and last_hidden_state [batch, length, hidden].
        """
        hidden = self.hidden_states(batch, deterministic)
        logits = self.mlm_head(hidden, batch["masked_positions"], self.encoder.embeddings.word)
        return {"mlm_logits": logits, "last_hidden_state": hidden}


def build_distilbert(model_cfg) -> nn.Module:
    return DistilBertForMaskedLM(BertConfig.from_config(model_cfg))
