"""SpanBERT (Joshi et al. 2020): BERT's encoder and MLM head, no NSP, plus the span boundary objective's head.

The paper trains single contiguous segments without NSP (§3.3, "Single-Sequence Training"), so the module has
no NSP head and no pooler: what it exports is a BertForMaskedLM, as SpanBERT's released checkpoints load. The
SBO head is the objective's (bert_jax/objectives/span_boundary.py, a layer above the models): the family registry
hands it in (`build_spanbert`'s `boundary_head`). It serves pre-training only and is left out of the export.
"""
import dataclasses
from typing import Callable

import flax.linen as nn
import jax

from bert_jax.models.bert import BertConfig, BertEncoder
from bert_jax.models.layers import EncoderModel, MaskedLMHead

SBO_HEAD = "span_boundary"  # the head's submodule, the one subtree the export leaves out
# The SBO head's inputs, in its argument order (data_pipelines/loader/span_boundaries.py's keys).
SPAN_BOUNDARY_KEYS = ("masked_span_left", "masked_span_right", "masked_span_offset")


@dataclasses.dataclass(frozen=True)
class SpanBertConfig(BertConfig):
    vocab_size: int = 28996  # BERT's cased WordPiece, which SpanBERT kept
    # The SBO's position table: offsets within a span up to sbo_max_span_tokens - 1 are predicted (SpanBERT's
    # --max-pair-targets 15), each embedded in sbo_position_size features (its pair_bert.py: 200).
    sbo_max_span_tokens: int = 15
    sbo_position_size: int = 200

    @classmethod
    def from_config(cls, model_cfg) -> "SpanBertConfig":
        config = super().from_config(model_cfg)
        if config.sbo_max_span_tokens < 1 or config.sbo_position_size < 1:
            raise ValueError(f"config.model.sbo_max_span_tokens={config.sbo_max_span_tokens} and "
                             f"config.model.sbo_position_size={config.sbo_position_size} must be >= 1")
        return config


class SpanBertForPreTraining(EncoderModel):
    """Encoder + MLM head at the masked positions + SBO head at the same positions, both decoders tied to the
    word table."""

    config: SpanBertConfig
    # (hidden [batch, length, hidden], left, right, offset [batch, predictions], word table) -> logits
    # [batch, predictions, vocab]: objectives/span_boundary.py's SpanBoundaryHead.
    span_boundary: nn.Module

    def setup(self):
        cfg = self.config
        init = nn.initializers.normal(cfg.initializer_range)
        self.encoder = BertEncoder(cfg)
        self.mlm_head = MaskedLMHead(cfg.hidden_size, cfg.vocab_size, "gelu", cfg.layer_norm_eps, cfg.dtype,
                                     cfg.param_dtype, init)
        nn.share_scope(self, self.mlm_head)

    def hidden_states(self, batch: dict, deterministic: bool) -> jax.Array:
        return self.encoder(batch["input_ids"], batch["attention_mask"], batch.get("token_type_ids"),
                            batch.get("position_ids"), batch.get("segment_ids"), deterministic)

    def __call__(self, batch: dict, deterministic: bool = True) -> dict:
        """batch: the pipeline's dict with data.span_boundaries' keys (masked_span_left, masked_span_right,
        masked_span_offset [batch, predictions]).

        Returns mlm_logits and sbo_logits [batch, predictions, vocab] (float32), last_hidden_state [batch, length,
        hidden] (for distillation; unused outputs cost nothing under jit). A batch without the boundaries (a forward
        for inspection, a distillation student's batch) gets no sbo_logits: the boundaries serve the objective
        alone, and the encoder and MLM head need none.
        """
        hidden = self.hidden_states(batch, deterministic)
        word = self.encoder.embeddings.word
        outputs = {"mlm_logits": self.mlm_head(hidden, batch["masked_positions"], word), "last_hidden_state": hidden}
        if SPAN_BOUNDARY_KEYS[0] in batch:
            outputs["sbo_logits"] = self.span_boundary(hidden, *(batch[key] for key in SPAN_BOUNDARY_KEYS), word)
        return outputs


def build_spanbert(model_cfg, boundary_head: Callable[[SpanBertConfig], nn.Module]) -> nn.Module:
    """The module for `config.model`, its SBO head `boundary_head(config)` (the family registry passes the
    objective's)."""
    config = SpanBertConfig.from_config(model_cfg)
    return SpanBertForPreTraining(config, boundary_head(config))


def validate_config(config) -> None:
    """The family's checks on the whole config: the batches must carry the spans' boundaries."""
    if not config.data.get("span_boundaries", False):
        raise ValueError(f"config.model.family={config.model.family!r} predicts each masked token from its span's "
                         f"boundaries: set config.data.span_boundaries=True (configs/spanbert_base.py does)")
    SpanBertConfig.from_config(config.model)
