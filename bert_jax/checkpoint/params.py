"""A pre-training run's params alone, read back from its newest (or a chosen) checkpoint.

Export, fine-tuning's `init_from` and the distillation teacher read a run this way. Restoring
params builds no optimizer and no train program: the abstract target is `jax.eval_shape` of the
family module's init, placed on this host's first device, whatever mesh the run trained on.
The module comes from the caller (`build_model`, e.g. `bert_jax.families.model_for`), so that this
layer, like the path layer below it, does not import the model zoo.
"""
from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import ml_collections
import orbax.checkpoint as ocp

from bert_jax import UserError
from bert_jax.checkpoint.manager import STATE_ITEM
from bert_jax.models.probe import abstract_params
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir


# The train state's subtrees a reader may take as "the params": the trained ones, or their EMA
# (config.train.ema_decay; `DIR:STEP:ema`, bert_jax/checkpoint/reference.py).
PARAMS, EMA = "params", "ema"


def state_metadata(run: Workdir, step: int) -> dict:
    """Checkpoint `step`'s train state as orbax recorded it ({"params": ..., "opt_state": ..., "ema": ...}, leaves
    with shape and dtype): read from the state item's folder alone, nothing restored."""
    folder = paths.path(paths.absolute(run.checkpoints)) / str(step) / STATE_ITEM  # orbax takes absolute paths
    return dict(ocp.PyTreeCheckpointHandler().metadata(folder))


def check_ema(run: Workdir, step: int) -> None:
    """A UserError, in one line, unless checkpoint `step` of `run` holds EMA weights."""
    if EMA not in state_metadata(run, step):
        raise UserError(f"{run}:{step}:ema: that checkpoint holds no EMA weights (the run trained with "
                        f"config.train.ema_decay=0); name {run}:{step} for its params")


def restore_params(run: Workdir, build_model: Callable[[ml_collections.ConfigDict], nn.Module],
                   step: int | None = None, ema: bool = False) -> tuple[dict, int]:
    """(params as numpy arrays, their step) of checkpoint `step` (default: the newest) of `run`.

    Unrolled or scanned as trained. Only the params are read (orbax partial restore):
    not the optimizer state, not the data iterator. `ema`: their EMA instead (`DIR:STEP:ema`), the same tree.
    """
    config = run.config()
    steps = run.checkpoint_steps()
    if not steps:
        raise UserError(f"{run.checkpoints} holds no checkpoint")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise UserError(f"step {step}: {run.checkpoints} holds steps {steps}")
    if ema:
        check_ema(run, step)
    subtree = EMA if ema else PARAMS
    model_cfg = ml_collections.ConfigDict(config.model.to_dict())
    # Parameter shapes do not depend on the attention kernel; the reference one builds on any host.
    model_cfg.attention_impl = "xla"
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                          abstract_params(build_model(model_cfg)))
    restore_args = jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=device), target)
    manager = ocp.CheckpointManager(
        paths.absolute(run.checkpoints), options=ocp.CheckpointManagerOptions(create=False),
        item_handlers={STATE_ITEM: ocp.PyTreeCheckpointHandler()})
    try:
        restored = manager.restore(step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.PyTreeRestore(
            item={subtree: target}, restore_args={subtree: restore_args}, partial_restore=True)}))
    finally:
        manager.close()
    return jax.device_get(restored[STATE_ITEM][subtree]), step
