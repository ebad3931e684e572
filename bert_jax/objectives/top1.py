"""The top-1 prediction over a vocabulary, for the accuracy metrics a train step logs."""
import jax
import jax.numpy as jnp


def top1(logits: jax.Array) -> jax.Array:
    """jnp.argmax(logits, axis=-1), ties to the first index, as two plain reductions (a max, then the least index that
    holds it): XLA's CPU compiler runs argmax's (value, index) reduction one element at a time, and on the MLM head of
    configs/first_run.py ([32, 20, 2048]) loss and accuracy took 9.7 ms that way against 1.6 ms so (docs/results/races.md).
    A row holding a NaN gets the vocabulary's size, which matches no label, where argmax gives the NaN's index."""
    largest = jnp.max(logits, axis=-1, keepdims=True)
    vocab = logits.shape[-1]
    return jnp.min(jnp.where(logits == largest, jnp.arange(vocab, dtype=jnp.int32), vocab), axis=-1)
