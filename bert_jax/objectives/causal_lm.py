"""Causal language modelling: each token predicts the next one, within its document (Radford et al. 2018, §3.1).

On packed rows (data_pipelines/examples/packing.py) a row holds several documents, told apart by `segment_ids`: the
last token of one document does not predict the first of the next, so a target counts only where the token and its
successor are real and of the same segment. The model attends causally and runs its LM head at every position
(`clm_logits`); the batch is unmasked (config.data.objective follows config.model.objective).

Ettin (Weller et al. 2025) trains ModernBERT's architecture so, and "Should We Still Pretrain Encoders with Masked
Language Modeling?" (Gisserot-Boukhlef et al. 2025, arXiv 2507.00994) trains a causal phase before a masked one.
Perplexity is exp of the mean next-token loss (`derived`, exact over any batch split as the loss is).
"""
import jax
import jax.numpy as jnp
import optax

from bert_jax.objectives.objective import Objective


def next_token_weights(batch: dict) -> jax.Array:
    """[batch, length - 1] float32: 1 where token t and token t + 1 are real and of the same document."""
    real = batch["attention_mask"] > 0
    both_real = real[:, :-1] & real[:, 1:]
    segments = batch.get("segment_ids")
    if segments is not None:
        both_real &= segments[:, :-1] == segments[:, 1:]
    return both_real.astype(jnp.float32)


def clm_sums(logits: jax.Array, batch: dict) -> dict:
    """logits: [batch, length, vocab] at every position; the target of position t is input_ids[t + 1]."""
    logits = logits[:, :-1].astype(jnp.float32)
    targets = batch["input_ids"][:, 1:]
    weights = next_token_weights(batch)
    xent = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return {"clm_loss": jnp.sum(xent * weights), "clm_accuracy": jnp.sum(correct * weights)}


def clm_weights(batch: dict) -> dict:
    total = jnp.sum(next_token_weights(batch))
    return {"clm_loss": total, "clm_accuracy": total}


CAUSAL_LM = Objective(
    sums=lambda outputs, batch: clm_sums(outputs["clm_logits"], batch),
    weights=clm_weights,
    loss_terms=("clm_loss",),
    headline=("clm_accuracy", "perplexity"),
    derived=lambda ratios: {"perplexity": jnp.exp(ratios["clm_loss"])},
)
