"""How many grain worker processes build a host's batches: config.data.worker_count, `auto` by default.

`auto` is min(AUTO_MAX, cores - 1): the host's cores (those this process may run on) less one for
the trainer, so a user gets the parallel loader without knowing the key; and 0 where that is
below 2, since one worker builds no faster than the prefetch thread (bench/loader_workers.py,
docs/results/benchmarks.md) and costs a process start.

The batches depend on the worker count: worker w of n builds the host's batches w, w + n, ...
from every n-th document of the host's share (pipeline.py), so 2 workers and 3 draw different
batches. 0 workers (a thread) and 1 give the same. Hence:

- the cap: every host with more than AUTO_MAX cores (TPU VMs, GPU nodes) resolves `auto` alike,
  and draws the same batches; a host of 1 or 2 cores resolves it to 0, the batches of before.
- a run records the number it resolved (DIR/config.json), and a resume under `auto` takes the
  recorded number whatever the host it lands on (bert_jax/train/loop.py), so a run relaunched
  on another VM type goes on with the same batches; a different explicit number is refused by
  the experiment check, naming data.worker_count (the checkpoint holds one iterator state per
  worker).
- two fresh runs of one config on hosts with different `auto` (fewer than AUTO_MAX + 1 cores)
  draw different batches: pin the number (e.g. data.worker_count=2) where that matters.

`WatchedIterator` makes a worker that dies at start-up an error, not a hang.
"""

from __future__ import annotations

import glob
import os
import queue
import threading
import weakref

import grain

AUTO = "auto"
# The cap makes every large host draw the same batches. Our estimate that 8 are enough: one process
# builds 25-43k sequences/s at seq 128 on a core (docs/results/benchmarks.md), 8 some 200k or more.
AUTO_MAX = 8
# How often WatchedIterator looks for a dead worker while no batch comes. grain looks every second itself, from the
# thread that waits for the batch: whichever looks first raises, grain's "Worker process was terminated unexpectedly
# with exit code -9" or this one's "grain worker process(es) died ... (exit code -9)"; on a loaded machine, where
# grain's thread may not run for seconds, either.
WATCH_POLL_S = 5.0


def host_cores() -> int:
    """The cores this process may run on (its affinity: a container's or taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def auto_worker_count(cores: int | None = None) -> int:
    """min(AUTO_MAX, cores - 1), a core left to the trainer; 0 (the prefetch thread) instead of 1."""
    count = min(AUTO_MAX, (host_cores() if cores is None else cores) - 1)
    return count if count >= 2 else 0


def worker_count(value) -> int:
    """config.data.worker_count as a number: `auto` resolves on this host (auto_worker_count)."""
    if value == AUTO:
        return auto_worker_count()
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"config.data.worker_count={value!r}: expected 'auto' or a number >= 0") from None
    if count < 0 or count != value and str(count) != str(value).strip():
        raise ValueError(f"config.data.worker_count={value!r}: expected 'auto' or a number >= 0")
    return count


def dead_children() -> list[tuple[int, int]]:
    """(pid, exit code) of this process's children that exited other than with 0 and were not reaped yet
    (a negative code: the signal that killed it). Linux (/proc, waitid); [] elsewhere. Reaps nothing."""
    dead = []
    for children in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(children) as f:  # /proc, never a user's path
                pids = [int(pid) for pid in f.read().split()]
        except OSError:
            continue
        for pid in pids:
            try:  # WNOWAIT: the child stays waitable for whoever started it
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                continue
            if info is None:
                continue  # alive
            code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
            if code != 0:
                dead.append((pid, code))
    return dead


def _fetch(owner: weakref.ref, requests: queue.Queue, results: queue.Queue) -> None:
    """WatchedIterator's thread: a batch of its grain iterator per request, until told to stop."""
    while requests.get():
        iterator = owner()
        if iterator is None:
            return
        try:
            results.put((next(iterator._parent), None))
        except BaseException as e:  # noqa: BLE001 (StopIteration included: handed to the trainer)
            results.put((None, e))
        del iterator


class WatchedIterator(grain.DatasetIterator):
    """The trainer's side of grain's worker processes: a worker that dies ends the run, naming it.

    grain notices a worker that dies while it runs (an error within a second). One that dies as it
    starts (killed, out of memory, user code that fails on import in a spawned process) is not
    noticed: CPython's spawn writes the pickled dataset, far more than a pipe holds, into a pipe
    whose reading end the parent itself keeps open, so that write, and the trainer waiting for a
    batch, wait forever (reproduced: two workers that exit on start-up left the trainer blocked).
    This iterator takes each batch from a thread of its own and, while none comes, looks every
    `poll_s` for a dead child process; finding one, it raises naming its pid and exit code.
    get_state / set_state are the grain iterator's own (checkpoints are unchanged).
    """

    def __init__(self, parent: grain.DatasetIterator, worker_count: int, poll_s: float | None = None):
        super().__init__(parent)  # grain's DatasetIterator keeps it as self._parent (and restores JSON states)
        self._worker_count = worker_count
        self._poll_s = WATCH_POLL_S if poll_s is None else poll_s
        self._requests: queue.Queue = queue.Queue()
        self._results: queue.Queue = queue.Queue()
        # The thread holds this iterator weakly, so dropping it closes grain's (and its workers) as before.
        threading.Thread(target=_fetch, args=(weakref.ref(self), self._requests, self._results), daemon=True,
                         name="grain-batch-watch").start()

    def __del__(self):
        self._requests.put(False)

    def __next__(self):
        self._requests.put(True)
        while True:
            try:
                batch, error = self._results.get(timeout=self._poll_s)
                break
            except queue.Empty:
                dead = dead_children()
                if dead:
                    self._requests.put(False)
                    raise RuntimeError(
                        "grain worker process(es) died before handing a batch over: "
                        + ", ".join(f"pid {pid} (exit code {code})" for pid, code in dead)
                        + f", of config.data.worker_count={self._worker_count}; the worker's own error, if it "
                        "printed one, is in the log above (a negative code is the signal that killed it: -9 is "
                        "SIGKILL, e.g. the kernel's out-of-memory killer)")
        if error is not None:
            raise error
        return batch

    def get_state(self) -> dict:
        return self._parent.get_state()

    def set_state(self, state: dict) -> None:
        self._parent.set_state(state)
