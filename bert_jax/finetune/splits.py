"""A run's train / validation / test rows and its label vocabulary, read through the task of `config.task.kind`.

Rows that cannot be used (a missing column, an empty text, an unknown label, a ragged
CoNLL line) are skipped and counted by reason, and the counts logged, as in pre-training.
A validation or test label the training file never had is an error naming it and the
file: silently dropping it would score a different task.
"""
import collections
import dataclasses

import numpy as np
from absl import logging

from bert_jax.finetune.tasks import get_task


@dataclasses.dataclass
class Split:
    name: str
    source: str  # the file (or tfds split) it came from, for messages
    rows: list[dict]
    skipped: collections.Counter


def read_splits(data_cfg, task_cfg) -> dict[str, Split]:
    """train, validation (its file, or a held-out `validation_fraction` of train by `split_seed`), test (optional)."""
    task = get_task(task_cfg.kind)
    out = {}
    for name in ("train", "validation", "test"):
        source = data_cfg[name]
        if source:
            rows, skipped = task.read(data_cfg, task_cfg, name, source)
            out[name] = Split(name, source, rows, skipped)
    if "train" not in out:
        raise ValueError("config.data.train names no file: set --config.data.train=PATH")
    if "validation" not in out:
        train = out["train"]
        order = np.random.default_rng(data_cfg.split_seed).permutation(len(train.rows))
        held = max(1, int(round(data_cfg.validation_fraction * len(train.rows))))
        out["validation"] = Split("validation", f"{train.source} (held-out {data_cfg.validation_fraction:.0%})",
                                  [train.rows[i] for i in sorted(order[:held])], collections.Counter())
        train.rows = [train.rows[i] for i in sorted(order[held:])]
    for split in out.values():
        if split.skipped:
            reasons = ", ".join(f"{reason}: {n}" for reason, n in split.skipped.most_common())
            logging.warning("%s: skipped %d bad row(s) of %s (%s)", split.name, sum(split.skipped.values()),
                            split.source, reasons)
        if not split.rows:
            raise ValueError(f"{split.source} holds no usable row for the {split.name} split")
    return out


def label_names(task_cfg, splits: dict[str, Split]) -> list[str]:
    """The label vocabulary: config.task.labels if given, else the training file's labels, sorted; [] for a
    task without named classes.

    Rows with a label outside a given vocabulary are skipped and counted; without one, a
    validation or test label the training file lacks fails, naming it and the file.
    """
    task = get_task(task_cfg.kind)
    if not task.has_labels(task_cfg):
        return []
    train = splits["train"]
    splits = task.labelled_splits(splits)
    if task_cfg.labels:
        names = [n.strip() for n in task_cfg.labels.split(",")]
        for split in splits.values():
            kept = [row for row in split.rows if set(task.label_values(row)) <= set(names)]
            if len(kept) < len(split.rows):
                split.skipped["unknown label"] += len(split.rows) - len(kept)
                logging.warning("%s: skipped %d row(s) of %s with a label outside config.task.labels", split.name,
                                len(split.rows) - len(kept), split.source)
                split.rows = kept
    else:
        names = sorted({v for row in train.rows for v in task.label_values(row)})
    for split in splits.values():
        for row in split.rows:
            unknown = set(task.label_values(row)) - set(names)
            if unknown:
                raise ValueError(f"label {sorted(unknown)[0]!r} in {split.source} ({split.name}) never occurs in "
                                 f"the training file {train.source}; its labels are {names}")
    return names
