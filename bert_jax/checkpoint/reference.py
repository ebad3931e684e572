"""`DIR:STEP[:ema]`: one checkpoint of a pre-training run, named the way every command names one.

Branches (`config.branch_from`), growth (`config.grow_from`), `bert-jax average --from` and the readers of a run's
params (`DIR:STEP:ema`: the EMA weights) all take this form. STEP is a number or `last` (the newest committed
checkpoint); without it, a reader takes `last`. Resolving checks what a command needs before it creates anything:
the run is there, the step is committed (an unfinished write, orbax's `<step>.orbax-checkpoint-tmp-*`, is named as
one), and the refusal names the key and the steps that are there.
"""
from __future__ import annotations

import dataclasses

import ml_collections

from bert_jax import UserError
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir

LAST = "last"
EMA = "ema"


@dataclasses.dataclass(frozen=True)
class CheckpointRef:
    """A committed checkpoint: the run's workdir, the step, and whether its EMA weights are meant."""

    workdir: str
    step: int
    ema: bool = False

    def __str__(self) -> str:
        return f"{self.workdir}:{self.step}" + (f":{EMA}" if self.ema else "")

    @property
    def run(self) -> Workdir:
        return Workdir(self.workdir)

    def config(self) -> ml_collections.ConfigDict:
        return self.run.config()


def split(text: str) -> tuple[str, int | str | None, bool]:
    """(workdir, step: an int, `last` or None, ema) of `DIR[:STEP][:ema]`; a URL's `gs://` is not a separator."""
    head, ema = text, False
    if head.endswith(f":{EMA}"):
        head, ema = head[: -len(EMA) - 1], True
    workdir, sep, tail = head.rpartition(":")
    if sep and workdir and not workdir.endswith(":/") and (tail.isdigit() or tail == LAST):
        return workdir, int(tail) if tail.isdigit() else LAST, ema
    return head, None, ema


def resolve(text: str, key: str, allow_ema: bool = True) -> CheckpointRef:
    """The committed checkpoint `text` names, or a UserError naming `key` (`config.branch_from`, `--from`)."""
    if not text:
        raise UserError(f"{key} is empty: name a pre-training run's checkpoint as DIR:STEP (STEP a number or last)")
    workdir, step, ema = split(text)
    if ema and not allow_ema:
        raise UserError(f"{key}={text!r}: `:ema` names EMA weights, which {key} does not take")
    run = Workdir(workdir)
    if not paths.fresh(run.root).exists():
        raise UserError(f"{key}={text!r}: {workdir} does not exist")
    if not run.holds_a_run():
        raise UserError(f"{key}={text!r}: {workdir} is not a pre-training run's directory (config.json and "
                        f"checkpoints/)")
    steps = run.checkpoint_steps()
    if not steps:
        raise UserError(f"{key}={text!r}: {run.checkpoints} holds no committed checkpoint")
    if step is None or step == LAST:
        step = steps[-1]
    elif step not in steps:
        unfinished = [p.name for p in paths.fresh(run.checkpoints).glob(f"{step}.orbax-checkpoint-tmp*")]
        what = f"an unfinished write ({unfinished[0]})" if unfinished else "not there"
        raise UserError(f"{key}={text!r}: step {step} of {workdir} is {what}; its committed steps are {steps}")
    return CheckpointRef(workdir, step, ema)
