"""SpanBERT's span boundary objective (SBO; Joshi et al. 2020, §3.2): a head plus its loss.

Each token x_i of a masked span x_s..x_e is predicted from the encoder's outputs at the two tokens just
outside the span and a learned embedding of its position within it:

    h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}]
    h1 = LayerNorm(GeLU(W1 h0 + b1))
    y_i = LayerNorm(GeLU(W2 h1 + b2))

and y_i is decoded over the vocabulary by the word embeddings (tied, as the MLM decoder) plus a bias of
its own, as SpanBERT's code does (`BertPairTargetPredictionHead` in facebookresearch/SpanBERT's
pretraining/fairseq/models/pair_bert.py: 200-wide position embeddings, spans cut at 15 tokens,
`--max-pair-targets 15`). The loss is the cross-entropy averaged over the predicted span tokens, added
to MLM's (`lm_loss / ntokens + pair_loss_weight * pair_loss / npairs` in its spanbert_loss.py).

The masker supplies the boundaries and offsets (data_pipelines/loader/span_boundaries.py). A token
whose offset is past the position table (SpanBERT's truncation) or whose span touches the row's edge
(no boundary token) weighs 0 here, in `sbo_weights`, so the denominators stay functions of the batch.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.layers import ACTIVATIONS, Dense, Embed, LayerNorm, gather_positions, logical
from bert_jax.models.spanbert import SpanBertConfig
from bert_jax.objectives.mlm import mlm_sums, mlm_weights
from bert_jax.objectives.objective import Objective

# SpanBERT's released settings (pretraining/README.md's command and pair_bert.py's defaults): SpanBertConfig's.
DEFAULT_MAX_SPAN_TOKENS = SpanBertConfig.sbo_max_span_tokens
DEFAULT_LOSS_WEIGHT = 1.0


class SpanBoundaryHead(nn.Module):
    """The SBO's predictor: [left boundary; right boundary; position] -> 2-layer MLP (GeLU, LayerNorm) -> tied
    decoder + bias. Parameters: `position` [max_span_tokens, position_size], `dense_1`, `norm_1`, `dense_2`,
    `norm_2`, `output_bias` [vocab]."""

    hidden_size: int
    vocab_size: int
    max_span_tokens: int
    position_size: int
    activation: str  # a key of ACTIVATIONS
    layer_norm_eps: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    kernel_init: nn.initializers.Initializer = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, hidden: jax.Array, left: jax.Array, right: jax.Array, offset: jax.Array, word) -> jax.Array:
        """hidden [batch, length, hidden]; left, right, offset [batch, predictions] int; `word` the tied table
        (Embed's `attend`) -> float32 logits [batch, predictions, vocab].

        Out-of-range indices (a span at the row's edge, an offset past the table) are clipped here to keep the
        gathers in bounds; `sbo_weights` gives those predictions weight 0."""
        length = hidden.shape[1]
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        positions = Embed(self.max_span_tokens, self.position_size, (None, None), embedding_init=self.kernel_init,
                          name="position", **kw)(jnp.clip(offset, 0, self.max_span_tokens - 1))
        h = jnp.concatenate([gather_positions(hidden, jnp.clip(left, 0, length - 1)),
                             gather_positions(hidden, jnp.clip(right, 0, length - 1)), positions], axis=-1)
        act = ACTIVATIONS[self.activation]
        h = Dense((h.shape[-1],), (self.hidden_size,), (None, "embed"), kernel_init=self.kernel_init,
                  name="dense_1", **kw)(h)
        h = LayerNorm(self.layer_norm_eps, name="norm_1", **kw)(act(h))
        h = Dense((self.hidden_size,), (self.hidden_size,), ("embed", None), kernel_init=self.kernel_init,
                  name="dense_2", **kw)(h)
        h = LayerNorm(self.layer_norm_eps, name="norm_2", **kw)(act(h))
        bias = self.param("output_bias", logical(nn.initializers.zeros, ("vocab",)), (self.vocab_size,),
                          self.param_dtype)
        logits = word.attend(h) + bias.astype(self.dtype)
        return nn.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))


def head_for(config: SpanBertConfig) -> SpanBoundaryHead:
    """The SBO head of a SpanBERT module (models/spanbert.py's `boundary_head`): the paper's GeLU, exact, as the MLM
    head's (SpanBERT's MLPWithLayerNorm takes config.hidden_act, gelu)."""
    return SpanBoundaryHead(config.hidden_size, config.vocab_size, config.sbo_max_span_tokens,
                            config.sbo_position_size, "gelu", config.layer_norm_eps, config.dtype, config.param_dtype,
                            nn.initializers.normal(config.initializer_range))


def sbo_weights(batch: dict, max_span_tokens: int) -> jax.Array:
    """[batch, predictions] float32: the predictions the SBO scores: real ones (masked_weights), offset within the
    position table, both boundary tokens inside the row."""
    length = batch["input_ids"].shape[1]
    inside = ((batch["masked_span_offset"] < max_span_tokens) & (batch["masked_span_left"] >= 0)
              & (batch["masked_span_right"] < length))
    return batch["masked_weights"].astype(jnp.float32) * inside.astype(jnp.float32)


def sbo_sums(logits: jax.Array, masked_ids: jax.Array, weights: jax.Array) -> dict:
    """Weighted cross-entropy and correct predictions of the SBO's logits [batch, predictions, vocab]."""
    sums = mlm_sums(logits, masked_ids, weights)
    return {"sbo_loss": sums["mlm_loss"], "sbo_accuracy": sums["mlm_accuracy"]}


def span_boundary_objective(max_span_tokens: int = DEFAULT_MAX_SPAN_TOKENS,
                            loss_weight: float = DEFAULT_LOSS_WEIGHT) -> Objective:
    """MLM + loss_weight x SBO, each averaged over its own predictions (SpanBERT's loss). loss_weight 0 trains
    MLM alone and still logs the (untrained) head's loss: an ablation arm with the same module and batches."""
    if not loss_weight >= 0:
        raise ValueError(f"config.model.sbo_loss_weight={loss_weight} must be >= 0")

    def sums(outputs: dict, batch: dict) -> dict:
        return {**mlm_sums(outputs["mlm_logits"], batch["masked_ids"], batch["masked_weights"]),
                **sbo_sums(outputs["sbo_logits"], batch["masked_ids"], sbo_weights(batch, max_span_tokens))}

    def weights(batch: dict) -> dict:
        total = jnp.sum(sbo_weights(batch, max_span_tokens))
        return {**mlm_weights(batch["masked_weights"]), "sbo_loss": total, "sbo_accuracy": total}

    return Objective(sums=sums, weights=weights, loss_terms=("mlm_loss", "sbo_loss"),
                     headline=("mlm_accuracy", "sbo_accuracy"), loss_scales={"sbo_loss": float(loss_weight)})


def objective_for(model_cfg) -> Objective:
    """The family hook: the objective with config.model.sbo_max_span_tokens and sbo_loss_weight."""
    return span_boundary_objective(model_cfg.get("sbo_max_span_tokens", DEFAULT_MAX_SPAN_TOKENS),
                                   model_cfg.get("sbo_loss_weight", DEFAULT_LOSS_WEIGHT))
