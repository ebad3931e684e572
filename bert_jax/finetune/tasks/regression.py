"""Sequence regression (STS-B): one real number per text or text pair, scored by Spearman and Pearson."""
import jax.numpy as jnp
import numpy as np

from bert_jax.finetune import metrics
from bert_jax.finetune.tasks.sequence import SequenceTask
from bert_jax.objectives.objective import Objective


def _sums(outputs: dict, batch: dict) -> dict:
    error = outputs["logits"][:, 0] - batch["labels"]
    return {"task_loss": jnp.sum(error**2 * batch["label_weights"])}


OBJECTIVE = Objective(sums=_sums, weights=lambda b: {"task_loss": jnp.sum(b["label_weights"])},
                      loss_terms=("task_loss",), headline=())


class Regression(SequenceTask):
    name = "regression"

    def parse_label(self, raw, skipped):
        try:
            return float(raw)
        except ValueError:
            skipped["label not a number"] += 1
            return None

    def has_labels(self, task_cfg):
        return False

    def num_outputs(self, names):
        return 1

    def labels(self, rows, names):
        return np.array([row["label"] for row in rows], np.float32)

    def objective(self, task_cfg):
        return OBJECTIVE

    def evaluate(self, task_cfg, outputs, features, names, rows):
        predicted = outputs["logits"][:, 0]
        out = {"loss": float(np.mean((predicted - features["labels"]) ** 2))}
        out.update(metrics.regression_metrics(predicted, features["labels"]))
        return out

    def headline_metric(self, task_cfg):
        return "spearman"

    def chance(self, task_cfg, train_rows, rows, names):
        mean = float(np.mean(self.labels(train_rows, names)))
        return metrics.regression_metrics(np.full(len(rows), mean), self.labels(rows, names))

    def predictions(self, task_cfg, outputs, features, rows, names):
        return [{"index": i, "prediction": float(v)} for i, v in enumerate(outputs["logits"][:, 0])]

    def hf_config(self, names):
        return {"num_labels": 1, "problem_type": "regression"}
