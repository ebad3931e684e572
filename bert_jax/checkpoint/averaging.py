"""Checkpoint averaging: the weighted mean of several checkpoints' params, written as a run of its own.

Merging decay branches of one stable run (mmBERT) or the last few checkpoints of one run (model soups, LAWA)
gives weights that often evaluate better than any of them. The output is a run directory like any other
(config.json, tokenizer/, checkpoints/<step>; the command adds DONE), so export, fine-tuning's `init_from` and
`evaluate` read it without knowing it was averaged; its config.json says so (`averaged_from`).

Nothing here builds a model: the sources are compared by their checkpoints' orbax metadata (tree paths and
shapes) and read as numpy trees, so any family averages the same way. The mean is taken in float64 and cast
back to each leaf's dtype: the average of a checkpoint with itself is that checkpoint, bit for bit.
"""
from __future__ import annotations

import dataclasses
import json
import math

import jax
import numpy as np
import orbax.checkpoint as ocp
from grain import checkpoint as grain_checkpoint

from bert_jax import UserError
from bert_jax.checkpoint import manager as manager_lib
from bert_jax.checkpoint.manager import DATA_ITEM, STATE_ITEM
from bert_jax.checkpoint.params import EMA, PARAMS, check_ema, state_metadata
from bert_jax.checkpoint.reference import CheckpointRef, resolve
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir

FROM, WEIGHTS, OUT = "--from", "--weights", "--out"
AVERAGED_FROM = "averaged_from"  # config.json's record of the sources
LINEAGE = "lineage"  # a branch's ancestry (config.branch_from): the first source's is kept


@dataclasses.dataclass(frozen=True)
class Source:
    ref: CheckpointRef
    weight: float  # normalised: the sources' weights sum to 1

    @property
    def subtree(self) -> str:
        """The train state's subtree averaged: the params, or their EMA for `DIR:STEP:ema`."""
        return EMA if self.ref.ema else PARAMS


def _read_only_manager(run: Workdir) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(paths.absolute(run.checkpoints), options=ocp.CheckpointManagerOptions(create=False),
                                 item_handlers={STATE_ITEM: ocp.PyTreeCheckpointHandler(),
                                                DATA_ITEM: grain_checkpoint.CheckpointHandler()})  # known, never read


def _weights(text: str | None, count: int) -> list[float]:
    if not text:
        return [1.0 / count] * count
    try:
        raw = [float(w) for w in text.split(",")]
    except ValueError:
        raise UserError(f"{WEIGHTS}={text!r}: expected numbers separated by commas, one per {FROM} checkpoint")
    if len(raw) != count:
        raise UserError(f"{WEIGHTS}={text!r} gives {len(raw)} weights for {count} {FROM} checkpoints: give one each")
    if not all(math.isfinite(w) and w > 0 for w in raw):
        raise UserError(f"{WEIGHTS}={text!r}: every weight must be a positive number")
    total = math.fsum(raw)
    return [w / total for w in raw]


def check(from_text: str, weights_text: str | None, out: str) -> list[Source]:
    """The sources `--from` names with their normalised weights, checked before anything is created.

    Refused in one line: no source, a missing run or step (reference.resolve), `:ema` of a checkpoint without an
    EMA, different families, parameter trees or shapes that differ (the first differing parameter named), weights
    that do not fit, an OUT that holds something already.
    """
    texts = [t.strip() for t in (from_text or "").split(",") if t.strip()]
    if not texts:
        raise UserError(f"{FROM} is empty: name the checkpoints to average as DIR:STEP,DIR:STEP[,...] "
                        f"(STEP a number or last; DIR:STEP:ema for a run's EMA weights)")
    refs = [resolve(text, FROM) for text in texts]
    weights = _weights(weights_text, len(refs))
    sources = [Source(ref, w) for ref, w in zip(refs, weights)]
    first = sources[0]
    family = first.ref.config().model.family
    want = None
    for source in sources:
        if source.ref.ema:
            check_ema(source.ref.run, source.ref.step)
        other = source.ref.config().model.family
        if other != family:
            raise UserError(f"{FROM}: {source.ref} is a {other!r} run, {first.ref} a {family!r} run: only checkpoints "
                            f"of one family average")
        shapes = manager_lib.shapes_by_path(state_metadata(source.ref.run, source.ref.step)[source.subtree])
        if want is None:
            want = shapes
            continue
        for key in sorted(set(want) | set(shapes)):
            if want.get(key) != shapes.get(key):
                have = lambda s: str(s.get(key, "missing"))  # noqa: E731
                raise UserError(f"{FROM}: {source.ref} differs from {first.ref} at parameter {key}: "
                                f"{have(shapes)} there, {have(want)} in {first.ref}")
    if out:
        target = paths.fresh(out)
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise UserError(f"{OUT}={out} exists and is not empty: name a new directory for the averaged run")
    else:
        raise UserError(f"{OUT} is empty: name a new directory for the averaged run")
    return sources


def _read(ref: CheckpointRef, subtree: str | None = None) -> dict:
    """Checkpoint `ref`'s train state (or one subtree of it) as numpy arrays on this host, whatever mesh wrote it."""
    metadata = state_metadata(ref.run, ref.step)
    if subtree is not None:
        metadata = {subtree: metadata[subtree]}
    item = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metadata)
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
    manager = _read_only_manager(ref.run)
    try:
        restored = manager.restore(ref.step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.PyTreeRestore(
            item=item, restore_args=restore_args, partial_restore=subtree is not None)}))
    finally:
        manager.close()
    return dict(restored[STATE_ITEM])


def average_params(trees: list[dict], weights: list[float]) -> dict:
    """sum_i w_i * tree_i in float64, cast back to each leaf's dtype (that of the first tree's)."""

    def mean(*leaves):
        total = np.zeros(leaves[0].shape, np.float64)
        for w, leaf in zip(weights, leaves):
            total += w * np.asarray(leaf, np.float64)
        return total.astype(leaves[0].dtype)

    return jax.tree.map(mean, *trees)


def _config(sources: list[Source]) -> dict:
    """The first source's config.json with the sources recorded; no EMA in the written state, so none configured."""
    config = json.loads(sources[0].ref.run.config_json.read_text())
    config.setdefault("train", {})["ema_decay"] = 0.0
    config[AVERAGED_FROM] = [{"workdir": s.ref.workdir, "step": s.ref.step, "ema": s.ref.ema, "weight": s.weight}
                             for s in sources]
    return config  # the first source's `lineage`, if any, is in it as it was


def write_average(sources: list[Source], out: str) -> int:
    """Writes the averaged run to `out` (checked by `check`); returns its step, the first source's."""
    first = sources[0]
    state = _read(first.ref)
    trees = [state[first.subtree]] + [_read(s.ref, s.subtree)[s.subtree] for s in sources[1:]]
    state[PARAMS] = average_params(trees, [s.weight for s in sources])
    # The rest is the first source's (optimizer state, step, rng); its EMA is not the average's, so it goes.
    state.pop(EMA, None)
    run = Workdir(out)
    run.root.mkdir(parents=True, exist_ok=True)
    paths.write_atomically(run.config_json, json.dumps(_config(sources), indent=2, sort_keys=True))
    tokenizer = first.ref.run.tokenizer
    if tokenizer.is_dir():  # a flat folder (vocab, tokenizer.json, ...)
        run.tokenizer.mkdir(parents=True, exist_ok=True)
        for file in tokenizer.iterdir():
            if file.is_file():
                paths.copy_file(file, run.tokenizer / file.name)
    checkpoint_cfg = first.ref.config().checkpoint
    checkpoint_cfg.async_save = False
    manager = manager_lib.make_manager(paths.absolute(run.checkpoints), checkpoint_cfg)
    try:
        # The state item alone, as the train loop saves it; no data item: an average has no position in a stream.
        manager.save(first.ref.step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardSave(state)}))
        manager.wait_until_finished()
    finally:
        manager.close()
    return first.ref.step
