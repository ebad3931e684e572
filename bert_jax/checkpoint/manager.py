"""Saving and restoring (train state, data-iterator state) with orbax.

A checkpoint holds params, optimizer state, step, the base RNG key and each host's
data-iterator position, so a resumed run continues with the identical batches.
"""
import json
import logging

import jax
import numpy as np
import orbax.checkpoint as ocp
from grain import checkpoint as grain_checkpoint

from bert_jax import StorageFault, UserError
from bert_jax.checkpoint import s3_store
from bert_jax.storage import paths


class _IteratorSnapshot:
    """The iterator's state taken when `save` is called.

    An async save may run grain's handler after the loop has drawn more batches;
    handing it a snapshot keeps the saved position the one of the saved step.
    """

    def __init__(self, iterator):
        state = iterator.get_state()
        self._state = state if isinstance(state, bytes) else json.dumps(state).encode()

    def get_state(self) -> bytes:
        return self._state


# The checkpoint item that holds the train state (`state=` in the save and restore arguments below).
STATE_ITEM = "state"
# The item that holds each host's data-iterator position (grain's handler).
DATA_ITEM = "data"


def preservation_policy(checkpoint_cfg) -> ocp.checkpoint_managers.PreservationPolicy:
    """The newest `max_to_keep` checkpoints, and every `keep_every_steps`-th step's for good (0: none).

    orbax's own policies (its `keep_period` option is deprecated for them): a kept step is never deleted, so a
    branch or an average can name it long after the rolling window moved on; a bucket deletes the same way.
    """
    policies = [ocp.checkpoint_managers.LatestN(n=checkpoint_cfg.max_to_keep)]
    keep_every = checkpoint_cfg.get("keep_every_steps", 0)
    if keep_every:
        policies.append(ocp.checkpoint_managers.EveryNSteps(interval_steps=keep_every))
    return ocp.checkpoint_managers.AnyPreservationPolicy(policies)


def make_manager(directory: str, checkpoint_cfg) -> ocp.CheckpointManager:
    s3_store.check_supported(directory)
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=checkpoint_cfg.async_save,
        create=True,
        preservation_policy=preservation_policy(checkpoint_cfg),
    )
    # Handlers are named up front so a fresh manager can read a checkpoint's metadata
    # (shapes, for the compatibility check) before anything is restored.
    handlers = {STATE_ITEM: ocp.StandardCheckpointHandler(), DATA_ITEM: grain_checkpoint.CheckpointHandler()}
    return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


class CheckpointSaveError(StorageFault):
    """A save failed (disk full, permissions, ...); the checkpoints committed before it are intact."""


def _unwritable(directory) -> str | None:
    """Why nothing can be written in `directory` ("OSError: [Errno 30] Read-only file system ..."), or None if a probe
    can be. orbax creates a step's folder in a thread and the save only times out waiting for it ("Timeout waiting
    for key '.../step_directory_creation'"), which hides a folder that became read-only or a full disk."""
    probe = paths.path(directory) / f".save_probe.{jax.process_index()}"
    try:
        probe.write_text("bert_jax save probe")
        probe.unlink()
    except Exception as error:  # noqa: BLE001  (whatever refuses the write is the cause to name)
        return f"{type(error).__name__}: {error}"
    return None


def _save_failed(manager: ocp.CheckpointManager, error: Exception) -> CheckpointSaveError:
    # orbax writes into `<step>.orbax-checkpoint-tmp` and renames on commit (in a bucket: its
    # commit marker), so a failed save leaves only a temporary that `all_steps` and resume skip.
    cause = f"{type(error).__name__}: {error}"
    refused = _unwritable(manager.directory)
    if refused is not None:
        cause = f"{refused}; orbax said {cause}"
    try:
        manager.reload()
        steps = sorted(manager.all_steps())
        resume = (f"run the same command to resume from step {steps[-1]}" if steps
                  else "no checkpoint was committed yet")
    except Exception:  # noqa: BLE001  (the store may still be unreachable: say what we can)
        steps, resume = "(not listable: the store does not answer)", "run the same command to resume"
    return CheckpointSaveError(
        f"saving a checkpoint in {manager.directory} failed ({cause}). "
        f"The committed checkpoints {steps} are intact: fix the cause (e.g. free disk space, "
        f"a bucket that is unreachable) and {resume}."
    )


def save(manager: ocp.CheckpointManager, step: int, state, iterator) -> None:
    """Starts an (async) save; raises CheckpointSaveError if this or an earlier async save failed."""
    try:
        manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                data=grain_checkpoint.CheckpointSave(_IteratorSnapshot(iterator)),
            ),
        )
    except Exception as error:  # noqa: BLE001  (orbax re-raises a background save's error here)
        if _out_of_memory(error):  # the host's or the device's, not the store's: raised as it is
            raise
        raise _save_failed(manager, error) from error


def wait_until_finished(manager: ocp.CheckpointManager) -> None:
    """Blocks until started saves are committed; raises CheckpointSaveError if one failed."""
    try:
        manager.wait_until_finished()
    except Exception as error:  # noqa: BLE001
        if _out_of_memory(error):  # the host's or the device's, not the store's: raised as it is
            raise
        raise _save_failed(manager, error) from error


def _path_key(path) -> str:
    """'params/encoder/...' for any pytree path: dataclass fields, dict keys and list indices alike."""
    parts = (getattr(k, "name", getattr(k, "key", getattr(k, "idx", k))) for k in path)
    return "/".join(str(p) for p in parts)


def shapes_by_path(tree) -> dict[str, tuple]:
    """{'params/encoder/...': shape} of a state, abstract state or orbax metadata tree: what two checkpoints, or a
    checkpoint and a config, are compared by."""
    return {_path_key(p): tuple(getattr(leaf, "shape", np.shape(leaf)))
            for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


class IncompatibleCheckpointError(UserError):
    """The checkpoint is readable but holds another model: falling back to an older one would not help."""


def check_compatible(manager: ocp.CheckpointManager, step: int, abstract_state, prefix: str = "") -> None:
    """Fails with the first mismatching tensor named, instead of a shape traceback from inside orbax.

    `prefix`: where `abstract_state` sits in the stored state ("params/" for params alone)."""
    stored_shapes = shapes_by_path(manager.item_metadata(step)[STATE_ITEM])
    for path, want in shapes_by_path(abstract_state).items():
        key = prefix + path
        have = stored_shapes.get(key, "missing")
        if have != want:
            raise IncompatibleCheckpointError(
                f"the checkpoint at {manager.directory} step {step} does not fit this config: "
                f"{key} is {have} there but the config gives {want}. "
                f"Use a fresh --workdir, or the config the checkpoint was written with."
            )


class CheckpointUnreachableError(RuntimeError):
    pass


def _connection_errors() -> tuple[type, ...]:
    errors: tuple[type, ...] = (ConnectionError, TimeoutError)
    try:
        import aiohttp  # noqa: PLC0415  (gcsfs' and s3fs' transport, when installed)
    except ImportError:
        return errors
    return (*errors, aiohttp.ClientConnectionError)


def _store_unreachable(error: BaseException, folder) -> bool:
    """Did the read fail because the store stopped answering, rather than because the checkpoint is bad?

    Either the error (or one it chains) is a connection error or TensorStore's UNAVAILABLE /
    DEADLINE_EXCEEDED, or a fresh look at the step's folder fails too. (A look at the checkpoints
    folder would not do: gcsfs answers it from its listing cache while the bucket is away.)
    """
    chain, seen = [], error
    while seen is not None and len(chain) < 16:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(isinstance(e, _connection_errors()) or "UNAVAILABLE" in str(e) or "DEADLINE_EXCEEDED" in str(e)
           for e in chain):
        return True
    try:
        folder.is_dir()
    except Exception:  # noqa: BLE001  (any failure to look is a store that does not answer)
        return True
    return False


# What a bug in the code that restores raises, never a damaged checkpoint. Damage reads as many kinds: TensorStore's
# OUT_OF_RANGE or DATA_LOSS (a truncated or garbled array file) as a ValueError, or as a bare Exception when orbax
# wraps it ("Encountered error while reading array index"), a garbled metadata file as a JSONDecodeError, a file gone
# as an OSError; so the set-aside names what it spares rather than what it takes.
_BUGS = (TypeError, AttributeError, NameError, AssertionError, NotImplementedError, ImportError)


def _out_of_memory(error: BaseException) -> bool:
    """A save or restore that ran out of host memory (MemoryError) or device memory (XLA's RESOURCE_EXHAUSTED)."""
    return isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in str(error)


def _set_aside_name(bad):
    """`<step>.corrupt`, or `<step>.corrupt.2`, ... when a step was set aside before (saved again, then cut again)."""
    name, n = bad.parent / f"{bad.name}.corrupt", 1
    while name.exists():
        n += 1
        name = bad.parent / f"{bad.name}.corrupt.{n}"
    return name


def restore_latest(manager: ocp.CheckpointManager, abstract_state, iterator):
    """Returns the newest readable state (placed by the shardings in `abstract_state`), or None if there is none.

    The iterator is restored in place (None: the state alone, e.g. at a stage's start, whose
    iterator is a new one, bert_jax/train/stages.py). A checkpoint that cannot be read (truncated,
    corrupted) is set aside as `<step>.corrupt` with a warning naming it, and the next
    older one is tried; if none can be read, the run stops rather than start over.
    A read that failed because the store stopped answering (a bucket briefly unreachable)
    must not cost a good checkpoint: then the run stops, nothing set aside, and the same
    command resumes later. Nor must running out of host or device memory, or a bug in the code that reads it (a
    TypeError, an AttributeError): each is raised as it is.
    """
    steps = sorted(manager.all_steps(), reverse=True)
    for step in steps:
        try:
            check_compatible(manager, step, abstract_state)
            items = dict(state=ocp.args.StandardRestore(abstract_state))
            if iterator is not None:
                items[DATA_ITEM] = grain_checkpoint.CheckpointRestore(iterator)
            restored = manager.restore(step, args=ocp.args.Composite(**items))
        except IncompatibleCheckpointError:
            raise
        except Exception as error:  # noqa: BLE001  (any read failure means: try an older one)
            if _out_of_memory(error):  # the host's or the device's fault, not the checkpoint's: an older one is no
                raise  # smaller, and setting this one aside would cost the resume
            bad = paths.path(manager.directory) / str(step)
            if _store_unreachable(error, bad):
                raise CheckpointUnreachableError(
                    f"checkpoint {bad} could not be read ({type(error).__name__}: {str(error)[:300]}): the store "
                    "did not answer. Nothing was set aside; run the same command again once it is reachable."
                ) from error
            if isinstance(error, _BUGS):  # a bug in the code that reads it (an AttributeError in an iterator's
                raise  # set_state): the checkpoint is not to blame, and setting it aside would cost the resume
            logging.warning("checkpoint %s cannot be read (%s: %.300s); falling back to an older one",
                            bad, type(error).__name__, error)
            if jax.process_index() == 0 and bad.is_dir():
                paths.move_tree(bad, _set_aside_name(bad))
            manager.reload()
            continue
        logging.info("restored checkpoint step %d from %s", step, manager.directory)
        return restored["state"]
    if steps:
        raise RuntimeError(f"none of the checkpoints {steps} in {manager.directory} can be read")
    return None


def restore_step(manager: ocp.CheckpointManager, step: int, abstract_state, iterator):
    """The state of checkpoint `step` (placed by the shardings in `abstract_state`); the iterator is restored in place
    to that step's position. A rollback's (bert_jax/run/spike.py): the step is one this run saved and read back."""
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=grain_checkpoint.CheckpointRestore(iterator)))
    logging.info("restored checkpoint step %d from %s", step, manager.directory)
    return restored["state"]
