"""Sentence-order prediction (Lan et al. 2020, §3.1): label 0 = the two segments in their order, 1 = swapped.

The same two-way classification as NSP, read from `sentence_order_label`; its negatives are
the two halves of one text in the wrong order, so the task is coherence, not topic.
"""
import jax

from bert_jax.objectives.nsp import nsp_sums, nsp_weights


def sop_sums(logits: jax.Array, labels: jax.Array) -> dict:
    """logits: [batch, 2]; labels: [batch] int; a negative label marks a padding example."""
    sums = nsp_sums(logits, labels)
    return {"sop_loss": sums["nsp_loss"], "sop_accuracy": sums["nsp_accuracy"]}


def sop_weights(labels: jax.Array) -> dict:
    weights = nsp_weights(labels)
    return {"sop_loss": weights["nsp_loss"], "sop_accuracy": weights["nsp_accuracy"]}
