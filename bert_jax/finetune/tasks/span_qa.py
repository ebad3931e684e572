"""Extractive question answering (SQuAD v1.1 / v2.0): start and end logits of every token, scored by EM / F1.

Its rows come from SQuAD JSON and its windows from bert_jax/finetune/squad.py. Its batches do
not pack: the windows already fill max_seq_length, and the loss reads the logits of every
position of a window, padding included, as Hugging Face's does.
"""
import collections

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.finetune import squad
from bert_jax.finetune.model import head_dense
from bert_jax.finetune.tasks.task import Task
from bert_jax.objectives.objective import Objective


def _sums(outputs: dict, batch: dict) -> dict:
    """The mean of the start and end positions' cross-entropies (Devlin et al. 2019, §4.2)."""
    logits, labels = outputs["logits"], batch["labels"]
    start = optax.softmax_cross_entropy_with_integer_labels(logits[..., 0], labels[:, 0])
    end = optax.softmax_cross_entropy_with_integer_labels(logits[..., 1], labels[:, 1])
    return {"task_loss": jnp.sum((start + end) / 2 * batch["label_weights"])}


OBJECTIVE = Objective(sums=_sums, weights=lambda b: {"task_loss": jnp.sum(b["label_weights"])},
                      loss_terms=("task_loss",), headline=())


class SpanHead(nn.Module):
    """Start and end logits of every token (HF's qa_outputs): [batch, length, 2]."""

    hidden_size: int
    initializer_range: float

    @nn.compact
    def __call__(self, encoded: list[dict], batch: dict, deterministic: bool) -> dict:
        logits = head_dense(self.hidden_size, 2, self.initializer_range, "qa_outputs")(encoded[0]["hidden"])
        return {"logits": logits.astype(jnp.float32)}


class SpanQA(Task):
    name = "span_qa"
    hf_class = "ForQuestionAnswering"
    packs = False

    def read(self, data_cfg, task_cfg, split, source) -> tuple[list[dict], collections.Counter]:
        if data_cfg.format == "jsonl":  # rows as read_squad gives them, one a line: bert-jax evaluate's OUT/data
            return super().read(data_cfg, task_cfg, split, source)
        return squad.read_squad(source)

    def parse(self, task_cfg, record: dict, split: str, skipped: collections.Counter) -> dict | None:
        """A JSONL record in read_squad's row form {id, question, context, answers: [[text, start], ...]}."""
        return {"id": str(record["id"]), "question": record["question"], "context": record["context"],
                "answers": [(str(text), int(start)) for text, start in record["answers"]]}

    def has_labels(self, task_cfg):
        return False

    def num_outputs(self, names):
        return 2

    def featurize(self, task_cfg, data_cfg, fast, rows, names):
        return squad.featurize(fast, rows, data_cfg.doc_stride)

    def build_head(self, family, model_cfg, task_cfg, num_outputs, has_family_pooler):
        return SpanHead(hidden_size=model_cfg.hidden_size,
                        initializer_range=float(model_cfg.get("initializer_range", 0.02)))

    def objective(self, task_cfg):
        return OBJECTIVE

    def evaluate(self, task_cfg, outputs, features, names, rows):
        logits, labels = outputs["logits"], features["labels"]
        log_probs = np.asarray(jax.nn.log_softmax(logits, 1))  # over positions
        nll = -(np.take_along_axis(log_probs[..., 0], labels[:, :1], 1) +
                np.take_along_axis(log_probs[..., 1], labels[:, 1:], 1))[:, 0] / 2
        out = {"loss": float(nll.mean())}
        out.update(squad.squad_metrics(self._answers(task_cfg, logits, features, rows), rows))
        return out

    def _answers(self, task_cfg, logits, features, rows) -> list[str]:
        return squad.best_answers(logits[..., 0], logits[..., 1], features, rows, task_cfg.max_answer_length)

    def headline_metric(self, task_cfg):
        return "f1"

    def predictions(self, task_cfg, outputs, features, rows, names):
        answers = self._answers(task_cfg, outputs["logits"], features, rows)
        return [{"id": row["id"], "answer": answer} for row, answer in zip(rows, answers)]

    def hf_config(self, names):
        return {}
