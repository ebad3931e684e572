"""Masked language modelling over the gathered masked positions."""
import jax
import jax.numpy as jnp
import optax


def mlm_sums(logits: jax.Array, masked_ids: jax.Array, masked_weights: jax.Array) -> dict:
    """logits: [batch, predictions, vocab]; masked_ids: [batch, predictions] int; masked_weights: same, float.

    Returns weighted sums of cross-entropy and of correct predictions; padding
    predictions carry weight 0 and so count for nothing.
    """
    logits = logits.astype(jnp.float32)
    xent = optax.softmax_cross_entropy_with_integer_labels(logits, masked_ids)
    correct = (jnp.argmax(logits, axis=-1) == masked_ids).astype(jnp.float32)
    return {
        "mlm_loss": jnp.sum(xent * masked_weights),
        "mlm_accuracy": jnp.sum(correct * masked_weights),
    }


def mlm_weights(masked_weights: jax.Array) -> dict:
    total = jnp.sum(masked_weights.astype(jnp.float32))
    return {"mlm_loss": total, "mlm_accuracy": total}
