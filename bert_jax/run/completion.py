"""The DONE marker: the one unambiguous sign that a run finished, for whoever relaunches runs.

A preempted run exits 0 after its save, exactly like a finished one, and a checkpoint at the
last step says nothing about fine-tuning's results; so a launcher (launch/ray_tpu.py) must not
read exit codes or checkpoints to decide. Process 0 writes `WORKDIR/DONE` once, after the
run's last output is written, through the path layer (one atomic object in a bucket). A run
stopped by a preemption, a crash or `stop_at_step` writes none.
"""
from __future__ import annotations

import json
import os
import time

from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir


def write_done(workdir: str | os.PathLike, step: int, last_step: int, kind: str) -> None:
    """Marks `workdir` finished at `step` of `last_step` (fewer when early stopping ended it)."""
    record = {"step": int(step), "last_step": int(last_step), "kind": kind, "finished_at": time.time()}
    paths.write_atomically(Workdir(workdir).done, json.dumps(record, sort_keys=True) + "\n")


def read_done(workdir: str | os.PathLike) -> dict | None:
    """The DONE record of `workdir`, or None while the run has not finished."""
    done = paths.fresh(Workdir(workdir).done)
    if not done.exists():
        return None
    return json.loads(done.read_text())
