"""The registry of fine-tuning task kinds: the only place that knows their names.

`config.task.kind` names one; the run, the splits, the export and the diagnosis ask it
(`get_task`) for everything that differs between kinds (bert_jax/finetune/tasks/task.py).
A new kind: one file with a `Task` subclass, and one line below.
"""
from bert_jax.finetune.tasks.classification import Classification
from bert_jax.finetune.tasks.regression import Regression
from bert_jax.finetune.tasks.sentence_embedding import SentenceEmbedding
from bert_jax.finetune.tasks.span_qa import SpanQA
from bert_jax.finetune.tasks.task import Task
from bert_jax.finetune.tasks.token_classification import TokenClassification
from bert_jax.registry import Registry

TASKS: Registry[Task] = Registry("config.task.kind", "kinds")


def register_task(task: Task) -> None:
    TASKS.register(task.name, task)


def known_tasks() -> list[str]:
    return sorted(TASKS.names())


def get_task(kind: str) -> Task:
    return TASKS.get(kind)


for _task in (Classification(), Regression(), TokenClassification(), SpanQA(), SentenceEmbedding()):
    register_task(_task)
