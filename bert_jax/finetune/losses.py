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


def _span_sums(outputs: dict, batch: dict) -> dict:
    """The mean of the start and end positions' cross-entropies (Devlin et al. 2019, §4.2)."""
    logits, labels = outputs["logits"], batch["labels"]
    start = optax.softmax_cross_entropy_with_integer_labels(logits[..., 0], labels[:, 0])
    end = optax.softmax_cross_entropy_with_integer_labels(logits[..., 1], labels[:, 1])
    return {"task_loss": jnp.sum((start + end) / 2 * batch["label_weights"])}


def _ranking_sums(outputs: dict, batch: dict) -> dict:
    """In-batch negatives (SBERT's MultipleNegativesRankingLoss): logits [batch, batch], the positive of u_i is
    v_i, every other v_j a negative; padding rows are nobody's negative."""
    w = batch["label_weights"]
    logits = jnp.where(w[None, :] > 0, outputs["logits"], -1e9)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.arange(logits.shape[0]))
    return {"task_loss": jnp.sum(loss * w)}


def _cosine_sums(outputs: dict, batch: dict) -> dict:
    """SBERT's CosineSimilarityLoss: the squared error of cos(u, v) [batch] to the pair's score."""
    return {"task_loss": jnp.sum((outputs["logits"] - batch["labels"]) ** 2 * batch["label_weights"])}


def _softmax_sums(outputs: dict, batch: dict) -> dict:
    loss = optax.softmax_cross_entropy_with_integer_labels(outputs["logits"], batch["labels"].astype(jnp.int32))
    return {"task_loss": jnp.sum(loss * batch["label_weights"])}


def _weights(batch: dict) -> dict:
    total = jnp.sum(batch["label_weights"])
    return {"task_loss": total, "accuracy": total}


CLASSIFICATION = Objective(sums=_classification_sums, weights=_weights, loss_terms=("task_loss",),
                           headline=("accuracy",))
REGRESSION = Objective(sums=_regression_sums, weights=lambda b: {"task_loss": jnp.sum(b["label_weights"])},
                       loss_terms=("task_loss",), headline=())
SPAN_QA = Objective(sums=_span_sums, weights=lambda b: {"task_loss": jnp.sum(b["label_weights"])},
                    loss_terms=("task_loss",), headline=())
_loss_only = lambda sums: Objective(sums=sums, weights=lambda b: {"task_loss": jnp.sum(b["label_weights"])},  # noqa: E731
                                   loss_terms=("task_loss",), headline=())
EMBEDDING = {"ranking": _loss_only(_ranking_sums), "cosine": _loss_only(_cosine_sums),
             "softmax": _loss_only(_softmax_sums)}
# Tagging is classification over word-pieces: the same sums over [batch, length] labels.
OBJECTIVES = {"classification": CLASSIFICATION, "regression": REGRESSION, "token_classification": CLASSIFICATION,
              "span_qa": SPAN_QA}


def objective_for(task_cfg) -> Objective:
    if task_cfg.kind == "sentence_embedding":
        return EMBEDDING[task_cfg.embedding_loss]
    return OBJECTIVES[task_cfg.kind]
