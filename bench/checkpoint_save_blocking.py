"""How long an asynchronous checkpoint save holds up the train loop, against the device-to-host copy.

    python -m bench.checkpoint_save_blocking [--shape=base] [--repeats=3]

The loop calls `bert_jax.checkpoint.manager.save` and goes on stepping; orbax copies
the arrays to host memory before `save` returns and writes them in a background
thread. The promise (issue 5): a save blocks a step no longer than that copy. This
prints, for a full train state (params + AdamW moments) of the chosen shape:

  device_get   the bare device-to-host transfer of the state (jax.device_get; on CPU
               this is a view, no bytes move)
  host copy    device_get plus one memcpy of every array: what a real transfer moves
  async save   how long `save` blocks with checkpoint.async_save=True
  commit       from the call until the checkpoint is committed on disk
  sync save    how long `save` blocks with async_save=False (the whole write)
"""
import os
import shutil
import tempfile
import time

import jax
import numpy as np
from absl import app, flags

from bench.train_step_throughput import SHAPES, shape_config
from bert_jax.checkpoint import manager as ckpt
from bert_jax.parallel.mesh import make_mesh
from bert_jax.train.program import build_program

_SHAPE = flags.DEFINE_enum("shape", "base", list(SHAPES), "Model shape whose train state is saved.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Saves timed per mode (the best is printed).")


class _NoIterator:
    """Stands for the data iterator: its state is a few bytes and not what is measured here."""

    def get_state(self):
        return {"position": 0}


def _timed_saves(state, async_save: bool, repeats: int) -> tuple[float, float]:
    """Best (seconds `save` blocks, seconds until committed) over `repeats` fresh saves."""
    c = shape_config(_SHAPE.value).checkpoint
    c.async_save, c.max_to_keep = async_save, 1
    blocks, commits = [], []
    for r in range(repeats):
        directory = tempfile.mkdtemp(prefix="ckpt_bench_")
        manager = ckpt.make_manager(directory, c)
        start = time.perf_counter()
        ckpt.save(manager, r + 1, state, _NoIterator())
        blocks.append(time.perf_counter() - start)
        ckpt.wait_until_finished(manager)
        commits.append(time.perf_counter() - start)
        manager.close()
        shutil.rmtree(directory)
    return min(blocks), min(commits)


def main(_):
    config = shape_config(_SHAPE.value)
    program = build_program(config, make_mesh(config.mesh))
    state = program.init()
    jax.block_until_ready(state)
    size = sum(np.dtype(x.dtype).itemsize * x.size for x in jax.tree.leaves(state))
    copies = []
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        jax.device_get(state)
        copies.append(time.perf_counter() - start)
    memcpys = []
    for _ in range(_REPEATS.value):
        start = time.perf_counter()
        jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(state))
        memcpys.append(time.perf_counter() - start)
    async_block, async_commit = _timed_saves(state, True, _REPEATS.value)
    sync_block, _ = _timed_saves(state, False, _REPEATS.value)
    print(f"shape {_SHAPE.value}: train state {size / 2**20:.0f} MiB on {jax.devices()[0].device_kind}")
    print("| what | seconds |\n|---|---|")
    print(f"| device_get (device-to-host transfer) | {min(copies):.3f} |")
    print(f"| host copy (device_get + memcpy) | {min(memcpys):.3f} |")
    print(f"| async save: blocks the loop | {async_block:.3f} |")
    print(f"| async save: until committed | {async_commit:.3f} |")
    print(f"| sync save: blocks the loop | {sync_block:.3f} |")


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    app.run(main)
