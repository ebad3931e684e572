"""What a kind of fine-tuning task is: everything that differs between kinds, in one object.

The run (bert_jax/finetune/run.py), the data splits, the export and the diagnosis ask the
task of `config.task.kind` (bert_jax/finetune/tasks/__init__.py) and never branch on its
name, as the train loop asks a `Family`. The defaults here are those of a task over one or
two text columns of CSV/TSV/JSONL/TFDS records with named labels; a kind overrides what it
does differently. A new kind is one file with one subclass, registered by name.
"""
import collections

import flax.linen as nn
import jax
import numpy as np

from bert_jax.hf import folder as hf_folder
from bert_jax.finetune import data, hf_heads
from bert_jax.finetune.model import POOLINGS, FinetuneModel
from bert_jax.objectives.objective import Objective
from bert_jax.train.step import make_train_step


class Task:
    name: str = ""
    # Hugging Face's head class suffix (Auto + this loads the export), e.g. "ForSequenceClassification".
    hf_class: str = ""
    # Whether batches may pack several examples into a row (bert_jax.finetune.data.pack_examples).
    packs: bool = True

    def validate(self, task_cfg) -> None:
        """Raises ValueError naming the config key this kind cannot run with."""

    # --- rows -------------------------------------------------------------------------------------------------
    def read(self, data_cfg, task_cfg, split: str, source: str) -> tuple[list[dict], collections.Counter]:
        """One split's usable rows from `source`; the others are counted by reason."""
        skipped, rows = collections.Counter(), []
        for record in data.read_records(data_cfg, source):
            row = self.parse(task_cfg, record, split, skipped)
            if row is not None:
                rows.append(row)
        return rows, skipped

    def parse(self, task_cfg, record: dict, split: str, skipped: collections.Counter) -> dict | None:
        """A record -> {"texts": [a] or [a, b], "label": str}, or None (counted in `skipped`)."""
        texts = [data.field(record, name, skipped) for name in data.text_field_names(task_cfg)]
        label = data.field(record, task_cfg.label_field, skipped)
        if any(t is None for t in texts) or label is None or data.any_empty(texts, skipped):
            return None
        label = self.parse_label(label, skipped)
        return None if label is None else {"texts": [str(t) for t in texts], "label": label}

    def parse_label(self, raw, skipped: collections.Counter):
        return str(raw)

    # --- labels -----------------------------------------------------------------------------------------------
    def has_labels(self, task_cfg) -> bool:
        """Whether the task has named classes (labels.json, id2label)."""
        return True

    def label_values(self, row: dict) -> list:
        return [row["label"]]

    def labelled_splits(self, splits: dict) -> dict:
        """The splits whose labels make up and must fit the label vocabulary."""
        return splits

    def num_outputs(self, names: list[str]) -> int:
        return max(len(names), 1)

    # --- model ------------------------------------------------------------------------------------------------
    def featurize(self, task_cfg, data_cfg, fast, rows: list[dict], names: list[str]) -> dict:
        """rows -> arrays: input_ids, attention_mask, token_type_ids [n, length], labels, label_weights, and
        any host-side keys (data.HOST_KEYS) the task's evaluation reads."""
        raise NotImplementedError

    def build_head(self, family, model_cfg, task_cfg, num_outputs: int, has_family_pooler: bool) -> nn.Module:
        raise NotImplementedError

    def build_model(self, family, model_cfg, task_cfg, num_outputs: int,
                    has_family_pooler: bool | None = None) -> FinetuneModel:
        """The family's encoder (as `backbone`) under this task's head (as `head`).

        has_family_pooler: whether the encoder pools [CLS] itself; it is what the family declares
        (`Family.roles.pooler`), and a caller's answer that contradicts it (pre-trained
        parameters with or without one) fails.
        """
        declared = family.roles.pooler is not None
        if has_family_pooler is not None and has_family_pooler != declared:
            raise ValueError(f"config.model.family={family.name!r} declares {'a' if declared else 'no'} pooler, but "
                             f"the pre-trained parameters {'lack' if declared else 'hold'} one")
        if task_cfg.pooling not in POOLINGS:
            raise ValueError(f"config.task.pooling={task_cfg.pooling!r}; expected one of {POOLINGS}")
        self.validate(task_cfg)
        backbone = family.build_model(model_cfg).clone(name="backbone")
        head = self.build_head(family, model_cfg, task_cfg, num_outputs, declared).clone(name="head")
        return FinetuneModel(backbone=backbone, head=head, texts=self.texts(task_cfg), pooling=task_cfg.pooling)

    def texts(self, task_cfg) -> tuple[str, ...]:
        """The feature-key prefixes of the texts the encoder reads per example ("" and, for pairs, "pair_")."""
        return ("",)

    def objective(self, task_cfg) -> Objective:
        raise NotImplementedError

    def make_train_step(self, model, objective: Objective, tx, config):
        """The step's function, (state, batch) -> (state, metrics): bert_jax/train/step.py's, micro-batches
        accumulated; a kind whose loss couples a batch's examples builds its own (sentence_embedding's GradCache)."""
        return make_train_step(model, objective, tx, config.train.grad_accum_steps)

    # --- scores -----------------------------------------------------------------------------------------------
    def evaluate(self, task_cfg, outputs: dict, features: dict, names: list[str], rows: list[dict]) -> dict:
        """Loss and metrics of one split's outputs (padding rows already dropped)."""
        raise NotImplementedError

    def headline_metric(self, task_cfg) -> str:
        raise NotImplementedError

    def chance(self, task_cfg, train_rows: list[dict], rows: list[dict], names: list[str]) -> dict:
        """The metrics on `rows` of the constant predictor that `train_rows` suggest (the majority class, the mean):
        what a model that learned nothing scores, which the diagnosis and the scoreboard compare a run with. {}
        where a kind has no such predictor."""
        return {}

    def predictions(self, task_cfg, outputs: dict, features: dict, rows: list[dict], names: list[str]) -> list:
        """One JSON-able line per test row (DIR/predictions.jsonl)."""
        raise NotImplementedError

    # --- export -----------------------------------------------------------------------------------------------
    def hf_config(self, names: list[str]) -> dict:
        """config.json values of the exported head (label maps, problem type)."""
        return {"id2label": {str(i): n for i, n in enumerate(names)}, "label2id": {n: i for i, n in enumerate(names)}}

    def check_export(self, task_cfg) -> None:
        """Raises ValueError naming the config key whose run Hugging Face's task class cannot hold."""
        if not self.hf_class:
            raise ValueError(f"config.task.kind={self.name!r} has no Hugging Face task class to export to")

    def hf_state(self, params: dict, config, names: list[str]) -> tuple[dict, dict]:
        """(HF state dict, config.json) of the fine-tuned model, for Auto{hf_class}."""
        self.check_export(config.task)
        return hf_heads.task_state(params, config, self.hf_class, self.hf_config(names))

    def export(self, out: str, params: dict, config, names: list[str], tokenizer_dir: str) -> str:
        """Writes the fine-tuned model where Hugging Face loads it; returns what it wrote, for the log."""
        state, hf_cfg = self.hf_state(params, config, names)
        hf_folder.write_hf_folder(out, state, hf_cfg, tokenizer_dir, model_max_length=config.data.max_seq_length)
        return hf_cfg["architectures"][0]


def nll(logits: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> float:
    """The weighted mean negative log-likelihood of integer labels under logits (last axis)."""
    log_probs = np.asarray(jax.nn.log_softmax(logits, -1))
    values = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    return float((values * weights).sum() / max(weights.sum(), 1e-9))
