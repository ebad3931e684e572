"""The task heads' objectives, as `Objective`s so the pre-training train step runs them unchanged.

Every batch carries `labels` and `label_weights` (0 for padding rows, ignored word-pieces),
so sums and weights total over the global batch exactly as the MLM's do.
"""
import jax.numpy as jnp
import optax

from bert_jax.objectives.objective import Objective


def _classification_sums(outputs: dict, batch: dict) -> dict:
    logits, labels, w = outputs["logits"], batch["labels"], batch["label_weights"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    return {"task_loss": jnp.sum(loss * w), "accuracy": jnp.sum(correct * w)}


def _regression_sums(outputs: dict, batch: dict) -> dict:
    error = outputs["logits"][:, 0] - batch["labels"]
    return {"task_loss": jnp.sum(error**2 * batch["label_weights"])}


def _weights(batch: dict) -> dict:
    total = jnp.sum(batch["label_weights"])
    return {"task_loss": total, "accuracy": total}


CLASSIFICATION = Objective(sums=_classification_sums, weights=_weights, loss_terms=("task_loss",),
                           headline=("accuracy",))
REGRESSION = Objective(sums=_regression_sums, weights=lambda b: {"task_loss": jnp.sum(b["label_weights"])},
                       loss_terms=("task_loss",), headline=())
# Tagging is classification over word-pieces: the same sums over [batch, length] labels.
OBJECTIVES = {"classification": CLASSIFICATION, "regression": REGRESSION, "token_classification": CLASSIFICATION}
