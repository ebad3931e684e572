"""Sequence classification (GLUE's SST-2, MNLI, …): one label of a fixed set per text or text pair."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.finetune import metrics
from bert_jax.finetune.tasks.sequence import SequenceTask
from bert_jax.finetune.tasks.task import nll
from bert_jax.objectives.objective import Objective


def _sums(outputs: dict, batch: dict) -> dict:
    logits, labels, w = outputs["logits"], batch["labels"], batch["label_weights"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    return {"task_loss": jnp.sum(loss * w), "accuracy": jnp.sum(correct * w)}


def _weights(batch: dict) -> dict:
    total = jnp.sum(batch["label_weights"])
    return {"task_loss": total, "accuracy": total}


# Cross-entropy of integer labels over the last axis, weighted: also tagging's, over word-pieces.
OBJECTIVE = Objective(sums=_sums, weights=_weights, loss_terms=("task_loss",), headline=("accuracy",))


class Classification(SequenceTask):
    name = "classification"

    def labels(self, rows, names):
        index = {n: i for i, n in enumerate(names)}
        return np.array([index[row["label"]] for row in rows], np.int32)

    def objective(self, task_cfg):
        return OBJECTIVE

    def evaluate(self, task_cfg, outputs, features, names, rows):
        logits = outputs["logits"]
        out = {"loss": nll(logits, features["labels"], features["label_weights"])}
        out.update(metrics.classification_metrics(logits.argmax(-1), features["labels"], len(names)))
        return out

    def headline_metric(self, task_cfg):
        return "accuracy"

    def chance(self, task_cfg, train_rows, rows, names):
        majority = int(np.bincount(self.labels(train_rows, names), minlength=len(names)).argmax())
        return metrics.classification_metrics(np.full(len(rows), majority), self.labels(rows, names), len(names))

    def predictions(self, task_cfg, outputs, features, rows, names):
        probs = np.asarray(jax.nn.softmax(outputs["logits"], -1))
        return [{"index": i, "label": names[int(p.argmax())], "probabilities": {n: float(x) for n, x in zip(names, p)}}
                for i, p in enumerate(probs)]

    def hf_config(self, names):
        return dict(super().hf_config(names), problem_type="single_label_classification")
