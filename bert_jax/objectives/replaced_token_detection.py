"""Replaced-token detection (Clark et al. 2020, ELECTRA §2): generator MLM + lambda x discriminator BCE.

A two-network module (bert_jax.models.replaced_token_detection) returns:
    mlm_logits   [batch, predictions, vocab]  the generator, at the gathered masked positions
    rtd_logits   [batch, length]              the discriminator: > 0 means "replaced"
    rtd_labels   [batch, length] float        1 where the corrupted token differs from the original
A token the generator sampled correctly is labelled original (§2: "if the generator happens to
generate the correct token, that token is considered 'real' instead of 'fake'").

The discriminator is scored on every real token (attention_mask), so its weights depend on the
batch alone; its accuracy on replaced and on original tokens is a quotient of two such ratios
(`derived`), exact over any batch split, since how many tokens were replaced is the model's doing.
"""
import jax
import jax.numpy as jnp
import optax

from bert_jax.objectives.mlm import mlm_sums, mlm_weights
from bert_jax.objectives.objective import Objective

# The paper's lambda (§2, "We use lambda = 50"); config.model.discriminator_loss_weight.
DEFAULT_DISCRIMINATOR_LOSS_WEIGHT = 50.0


def rtd_sums(logits: jax.Array, labels: jax.Array, token_weights: jax.Array) -> dict:
    """logits, labels, token_weights: [batch, length]; labels 1 = replaced; weights 0 on padding."""
    logits = logits.astype(jnp.float32)
    labels = labels.astype(jnp.float32)
    w = token_weights.astype(jnp.float32)
    bce = optax.sigmoid_binary_cross_entropy(logits, labels)
    correct = ((logits > 0).astype(jnp.float32) == labels).astype(jnp.float32)
    return {
        "discriminator_loss": jnp.sum(bce * w),
        "discriminator_accuracy": jnp.sum(correct * w),
        "replaced_rate": jnp.sum(labels * w),
        "discriminator_replaced_hits": jnp.sum(correct * labels * w),
        "discriminator_original_hits": jnp.sum(correct * (1.0 - labels) * w),
    }


def rtd_weights(attention_mask: jax.Array) -> dict:
    total = jnp.sum(attention_mask.astype(jnp.float32))
    return {k: total for k in ("discriminator_loss", "discriminator_accuracy", "replaced_rate",
                               "discriminator_replaced_hits", "discriminator_original_hits")}


def rtd_derived(ratios: dict) -> dict:
    """Accuracy on replaced tokens and on original ones, from ratios over the same real tokens."""
    replaced = ratios["replaced_rate"]
    return {
        "discriminator_replaced_accuracy": ratios["discriminator_replaced_hits"] / jnp.maximum(replaced, 1e-9),
        "discriminator_original_accuracy": ratios["discriminator_original_hits"] / jnp.maximum(1.0 - replaced, 1e-9),
    }


def _sums(outputs: dict, batch: dict) -> dict:
    generator = mlm_sums(outputs["mlm_logits"], batch["masked_ids"], batch["masked_weights"])
    return {
        "generator_mlm_loss": generator["mlm_loss"],
        "generator_mlm_accuracy": generator["mlm_accuracy"],
        **rtd_sums(outputs["rtd_logits"], outputs["rtd_labels"], batch["attention_mask"]),
    }


def _weights(batch: dict) -> dict:
    generator = mlm_weights(batch["masked_weights"])
    return {
        "generator_mlm_loss": generator["mlm_loss"],
        "generator_mlm_accuracy": generator["mlm_accuracy"],
        **rtd_weights(batch["attention_mask"]),
    }


def replaced_token_detection(discriminator_loss_weight: float = DEFAULT_DISCRIMINATOR_LOSS_WEIGHT) -> Objective:
    """Loss = generator MLM + discriminator_loss_weight x discriminator BCE (mean over real tokens)."""
    if not discriminator_loss_weight > 0:
        raise ValueError(f"config.model.discriminator_loss_weight={discriminator_loss_weight} must be > 0")
    return Objective(
        sums=_sums, weights=_weights, loss_terms=("generator_mlm_loss", "discriminator_loss"),
        headline=("discriminator_accuracy", "discriminator_replaced_accuracy", "discriminator_original_accuracy",
                  "generator_mlm_accuracy"),
        loss_scales={"discriminator_loss": float(discriminator_loss_weight)},
        derived=rtd_derived,
    )


def objective_for(model_cfg) -> Objective:
    """The family hook: the objective with config.model.discriminator_loss_weight (lambda)."""
    return replaced_token_detection(model_cfg.get("discriminator_loss_weight", DEFAULT_DISCRIMINATOR_LOSS_WEIGHT))
