"""Saves that fail part-way (a full disk) must leave the earlier checkpoints usable."""
import errno
import os
import shutil

import pytest
from grain._src.python.checkpoint import handler as grain_handler
from test_pretrain import micro_config, straight_run, train_losses  # noqa: F401  (fixture)

from bert_jax.checkpoint.manager import CheckpointSaveError
from bert_jax.train.loop import train_and_evaluate


@pytest.mark.slow  # the default suite's time budget (2 cores): run with -m slow
def test_disk_full_during_a_save_leaves_earlier_checkpoints_usable(straight_run, tmp_path, monkeypatch):
    workdir = str(tmp_path / "run")
    shutil.copytree(os.path.join(straight_run[0], "tokenizer"), os.path.join(workdir, "tokenizer"))
    config = micro_config()
    config.checkpoint.every_steps = 2
    real_save = grain_handler.CheckpointHandler.save

    def disk_full_at_step_6(self, directory, item=None, args=None):
        # The data item of a checkpoint is written after orbax has begun writing the
        # arrays: the device fills up half-way through step 6's checkpoint.
        if os.path.basename(os.path.dirname(str(directory))).startswith("6"):
            (directory / "process_0-of-1.json").write_text('{"trunc')
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(self, directory, item, args)

    monkeypatch.setattr(grain_handler.CheckpointHandler, "save", disk_full_at_step_6)
    with pytest.raises(CheckpointSaveError, match=r"No space left on device.*\[2, 4\] are intact"):
        train_and_evaluate(config, workdir)
    monkeypatch.undo()

    # The same command resumes from step 4 and trains exactly as the uninterrupted run did.
    train_and_evaluate(config, workdir)
    steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert steps[-1] == 8
    straight = dict(train_losses(straight_run[0]))
    resumed = dict(train_losses(workdir))
    assert sorted(resumed) == list(range(1, 9))
    for step in range(5, 9):
        assert resumed[step] == straight[step], step  # resume is exact: the same program on the restored state


class Position:
    """A data iterator at its smallest: what grain's checkpoint handler saves and restores."""

    def __init__(self, index: int = 0):
        self.index = index

    def get_state(self) -> dict:
        return {"index": self.index}

    def set_state(self, state) -> None:
        import json

        self.index = json.loads(state)["index"] if isinstance(state, (bytes, str)) else state["index"]


@pytest.mark.parametrize("fault", [MemoryError(), RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 4 GiB"),
                                   AttributeError("'Position' object has no attribute 'start_prefetch'")],
                         ids=["host_memory", "device_memory", "bug"])
def test_a_restore_that_fails_for_the_machine_or_the_code_raises_and_sets_no_checkpoint_aside(tmp_path, monkeypatch,
                                                                                             fault):
    """Running out of memory while restoring is the machine's fault, and a bug in the code that restores (an iterator
    without the method grain calls) the code's, not the checkpoint's damage: each is raised as it is, and the
    checkpoints stay (a read failure would set the newest aside as <step>.corrupt and try an older one; for a bug,
    setting each aside in turn cost every one of them)."""
    import jax
    import numpy as np

    from bert_jax.checkpoint import manager as ckpt

    config = micro_config()
    config.checkpoint.async_save = False
    manager = ckpt.make_manager(str(tmp_path / "checkpoints"), config.checkpoint)
    state = {"w": np.arange(4, dtype=np.float32)}
    for step in (1, 2):
        ckpt.save(manager, step, state, Position(step))
    ckpt.wait_until_finished(manager)

    def failing(self, directory, item=None, args=None):
        raise fault

    monkeypatch.setattr(grain_handler.CheckpointHandler, "restore", failing)
    with pytest.raises(type(fault)) as raised:
        ckpt.restore_latest(manager, jax.eval_shape(lambda: state), Position())
    assert raised.value is fault
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1", "2"]
    manager.close()


@pytest.mark.parametrize("fault", [MemoryError(), RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 4 GiB")],
                         ids=["host", "device"])
@pytest.mark.parametrize("where", ["save", "wait_until_finished"])
def test_a_save_out_of_memory_is_raised_as_itself_not_named_a_storage_fault(tmp_path, monkeypatch, fault, where):
    """Running out of memory while saving is the machine's fault: a CheckpointSaveError would tell the user to free
    disk space or mend the bucket (issue 76)."""
    import numpy as np
    import orbax.checkpoint as ocp

    from bert_jax.checkpoint import manager as ckpt

    config = micro_config()
    config.checkpoint.async_save = False
    manager = ckpt.make_manager(str(tmp_path / "checkpoints"), config.checkpoint)

    def out_of_memory(*args, **kwargs):
        raise fault

    monkeypatch.setattr(ocp.CheckpointManager, where, out_of_memory)
    with pytest.raises(type(fault)) as raised:
        ckpt.save(manager, 1, {"w": np.arange(4, dtype=np.float32)}, Position(1))
        ckpt.wait_until_finished(manager)
    assert raised.value is fault
