"""RoBERTa (Liu et al. 2019): BERT's encoder trained by MLM alone, one token type, fairseq positions.

What differs from BERT, and why it matters for Hugging Face parity:
- positions start at `pad_token_id + 1` (fairseq's `make_positions`): a real token at
  index i of its sequence looks up row `pad_token_id + 1 + i`, padding looks up row
  `pad_token_id`; hence 514 position rows for 512 tokens. Hugging Face derives them
  from `input_ids != pad_token_id`; we derive them from `attention_mask`, which is the
  same wherever padding is padding. Packed batches bring their own `position_ids`
  (restarting at 0 per document); they are shifted by the same offset.
- one token type (`type_vocab_size=1`): every token uses row 0, whatever the batch says.
- no NSP and no pooler: the model is RobertaForMaskedLM's (encoder + `lm_head`).
"""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.bert import BertConfig, BertEncoder
from bert_jax.models.layers import EncoderModel, MaskedLMHead


@dataclasses.dataclass(frozen=True)
class RobertaConfig(BertConfig):
    vocab_size: int = 50265
    max_position_embeddings: int = 514
    type_vocab_size: int = 1
    layer_norm_eps: float = 1e-5
    # The tokenizer's <pad> id; positions are offset by it + 1 (byte-level BPE puts <pad> at 1).
    pad_token_id: int = 1


def roberta_position_ids(attention_mask: jax.Array, position_ids: jax.Array | None, pad_token_id: int) -> jax.Array:
    """[batch, length] rows of the position table: pad_token_id + 1 + position for real tokens, pad_token_id
    for padding. `position_ids` (packed batches) replaces the running count of real tokens."""
    real = attention_mask.astype(jnp.int32)
    if position_ids is None:
        position_ids = jnp.cumsum(real, axis=1) - 1
    return jnp.where(real > 0, position_ids + pad_token_id + 1, pad_token_id).astype(jnp.int32)


class RobertaForMaskedLM(EncoderModel):
    """Encoder + the MLM head at the masked positions (dense, GELU, LayerNorm, tied decoder, bias), in BERT's
    parameter names, so tools written for one family's tree read the other's. No pooler: heads pool [CLS]
    themselves (as RobertaClassificationHead)."""

    config: RobertaConfig

    def setup(self):
        cfg = self.config
        self.encoder = BertEncoder(cfg)
        self.mlm_head = MaskedLMHead(cfg.hidden_size, cfg.vocab_size, "gelu", cfg.layer_norm_eps, cfg.dtype,
                                     cfg.param_dtype, nn.initializers.normal(cfg.initializer_range))
        nn.share_scope(self, self.mlm_head)

    def hidden_states(self, batch: dict, deterministic: bool) -> jax.Array:
        cfg = self.config
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        if input_ids.shape[1] + cfg.pad_token_id + 1 > cfg.max_position_embeddings:
            # Shapes are static: this fails at init, before any compilation, not as silently clamped positions.
            raise ValueError(
                f"sequences of {input_ids.shape[1]} tokens need config.model.max_position_embeddings >= "
                f"{input_ids.shape[1] + cfg.pad_token_id + 1} (positions start at pad_token_id + 1 = "
                f"{cfg.pad_token_id + 1}); it is {cfg.max_position_embeddings}"
            )
        positions = roberta_position_ids(attention_mask, batch.get("position_ids"), cfg.pad_token_id)
        return self.encoder(input_ids, attention_mask, jnp.zeros_like(input_ids), positions,
                            batch.get("segment_ids"), deterministic)

    def __call__(self, batch: dict, deterministic: bool = True) -> dict:
        """batch: input_ids, attention_mask, masked_positions [batch, ...]; optional position_ids, segment_ids.

        Returns mlm_logits [batch, predictions, vocab] (float32) and last_hidden_state [batch, length,
        hidden] (for distillation; unused outputs cost nothing under jit). `token_type_ids` is ignored.
        """
        hidden = self.hidden_states(batch, deterministic)
        logits = self.mlm_head(hidden, batch["masked_positions"], self.encoder.embeddings.word)
        return {"mlm_logits": logits, "last_hidden_state": hidden}


def build_roberta(model_cfg) -> nn.Module:
    return RobertaForMaskedLM(RobertaConfig.from_config(model_cfg))
