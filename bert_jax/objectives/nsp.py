"""Next-sentence prediction (label 0: B follows A; 1: B is random), as in Hugging Face."""
import jax
import jax.numpy as jnp
import optax


def nsp_sums(logits: jax.Array, labels: jax.Array) -> dict:
    """logits: [batch, 2]; labels: [batch] int; a negative label marks a padding example."""
    valid = (labels >= 0).astype(jnp.float32)
    safe = jnp.maximum(labels, 0)
    xent = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), safe)
    correct = (jnp.argmax(logits, axis=-1) == safe).astype(jnp.float32)
    return {"nsp_loss": jnp.sum(xent * valid), "nsp_accuracy": jnp.sum(correct * valid)}


def nsp_weights(labels: jax.Array) -> dict:
    total = jnp.sum((labels >= 0).astype(jnp.float32))
    return {"nsp_loss": total, "nsp_accuracy": total}
