"""One live run per workdir: a lease object with a heartbeat, held by process 0 of the run.

Two processes training into one workdir overwrite each other's checkpoints and metrics
without a word. It happens when a relauncher starts a run while a "preempted" host is
still alive, or when a person runs the same command twice. So before anything is
written, process 0 takes `WORKDIR/LEASE`, and a heartbeat thread rewrites it every
`lease.heartbeat_s`. Everything goes through the path layer, so it works in a bucket.

- A live lease (heartbeat younger than `lease.timeout_s`) of another process stops this
  one before step 0, naming the holder; `lease.wait_s` > 0 waits that long for it to end
  first (a relauncher that knows the old hosts are gone sets it past the timeout).
- A stale lease (its holder died without releasing it) is taken over, with a warning. On the
  holder's own host a dead pid is stale at once, so `kill -9` and the same command resume.
- An object store has no compare-and-swap here, so a takeover is checked: the writer
  reads the lease back after `lease.settle_s`, and of two racing writers only the last
  one finds its own id. Each heartbeat checks it still holds the lease; a run that lost
  it stops at its next step (`check`) instead of writing beside the new holder.
- The other hosts of the run join it: they write nothing (process 0 speaks for the run).

Released (deleted) when the run ends in any way but a kill; a killed holder's lease goes
stale after `lease.timeout_s`.

Time comes from a `Clock` (wall time and sleep), which tests replace: whether a heartbeat is
live or stale is then decided by the clock the test sets, not by how long a loaded machine
took to write and read it back. Each heartbeat is one call of `Lease.beat` (the thread calls
it every `heartbeat_s`); `Lease.beats` counts them, and `wait_for_beats` waits on that count.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
import uuid
from typing import Callable

import ml_collections
from absl import logging

from bert_jax import UserError
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir


class LeaseHeldError(UserError, RuntimeError):
    """Another live run holds the workdir."""


class LeaseLostError(RuntimeError):
    """This run's lease was taken over: another run now writes the workdir."""


def default_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.enabled = True
    c.heartbeat_s = 15.0  # how often process 0 rewrites the lease
    c.timeout_s = 90.0  # a heartbeat older than this means the holder is gone
    c.wait_s = 0.0  # how long to wait for a live holder to end before refusing
    c.settle_s = 1.0  # read back after writing: the last of two racing writers wins
    return c


class Clock:
    """Where the lease reads the time and waits: the wall clock, or a test's."""

    def __init__(self, time_fn: Callable[[], float] = time.time, sleep_fn: Callable[[float], None] = time.sleep):
        self.time, self.sleep = time_fn, sleep_fn


WALL_CLOCK = Clock()


def read_lease(workdir: str | os.PathLike) -> dict | None:
    """The lease record ({run_id, host, pid, started_at, heartbeat, process_count}), or None."""
    try:
        return json.loads(Workdir(workdir).lease.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:  # a half-written local file of a killed holder: nobody's
        return None


def _process_gone(record: dict) -> bool:
    """The holder ran on this host and its process has exited (a `kill -9`): no need to wait for the timeout."""
    if record["host"] != socket.gethostname():
        return False
    try:
        os.kill(record["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def lease_is_live(record: dict | None, timeout_s: float, now: float | None = None) -> bool:
    """Held by a process that still heartbeats (and, on this host, still exists)."""
    if record is None or _process_gone(record):
        return False
    return (time.time() if now is None else now) - record["heartbeat"] < timeout_s


def describe(record: dict, now: float | None = None) -> str:
    now = time.time() if now is None else now
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record["started_at"]))
    return (f"run {record['run_id']} on host {record['host']}, pid {record['pid']}, started {started}, "
            f"last heartbeat {now - record['heartbeat']:.0f} s ago")


# This process's leases by workdir: a process trains one run at a time, so a lease it still
# holds there (a run that raised before its harness started) is its own, not another run's.
_HELD: dict[str, "Lease"] = {}


class Lease:
    """Process 0's hold on a workdir; `acquire` returns a started one."""

    def __init__(self, workdir: str, cfg, process_count: int, clock: Clock = WALL_CLOCK):
        self.workdir, self.cfg, self.clock = str(workdir), cfg, clock
        self.path = Workdir(workdir).lease
        now = clock.time()
        self.record = {"run_id": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
                       "started_at": now, "heartbeat": now, "process_count": process_count}
        self.lost: dict | None = None  # the record that replaced ours
        self._stop = threading.Event()
        self.beats = 0  # heartbeats written since the lease was taken
        self._beaten = threading.Condition()
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)

    def _write(self) -> None:
        self.record["heartbeat"] = self.clock.time()
        paths.write_atomically(self.path, json.dumps(self.record, sort_keys=True))

    def _take(self) -> None:
        deadline = self.clock.time() + float(self.cfg.wait_s)
        while True:
            held = read_lease(self.workdir)
            if not lease_is_live(held, self.cfg.timeout_s, now=self.clock.time()):
                break
            if self.clock.time() >= deadline:
                raise LeaseHeldError(
                    f"{self.workdir} is in use by another live run ({describe(held, self.clock.time())}). "
                    f"Two runs in one workdir "
                    f"would overwrite each other's checkpoints. Stop that run, or wait until its lease is "
                    f"{self.cfg.timeout_s:.0f} s old (config.lease.timeout_s) if it is gone, or use another "
                    f"--workdir.")
            self.clock.sleep(min(1.0, self.cfg.heartbeat_s))
        if held is not None:
            logging.warning("taking over the stale lease of %s: %s", self.workdir, describe(held, self.clock.time()))
        self._write()
        self.clock.sleep(float(self.cfg.settle_s))
        now_held = read_lease(self.workdir)
        if now_held is None or now_held["run_id"] != self.record["run_id"]:
            raise LeaseHeldError(f"{self.workdir}: another run took the lease at the same moment "
                                 f"({describe(now_held, self.clock.time()) if now_held else 'and released it'}); "
                                 f"not starting.")

    def beat(self) -> bool:
        """One heartbeat: rewrites the lease if it is still ours; False (and `lost` set) once another run holds it."""
        try:
            held = read_lease(self.workdir)
            if held is not None and held["run_id"] != self.record["run_id"]:
                self.lost = held
                logging.error("the lease of %s was taken over by %s", self.workdir, describe(held, self.clock.time()))
                return False
            self._write()
        except Exception as error:  # noqa: BLE001  (a bucket hiccup: the next beat retries)
            logging.warning("lease heartbeat of %s failed: %s", self.workdir, error)
        finally:
            with self._beaten:
                self.beats += 1
                self._beaten.notify_all()
        return True

    def wait_for_beats(self, count: int, timeout_s: float | None = None) -> bool:
        """Waits until `count` heartbeats were made (or the lease was lost); False if `timeout_s` passed first."""
        with self._beaten:
            return self._beaten.wait_for(lambda: self.beats >= count or self.lost is not None, timeout_s)

    def _beat(self) -> None:
        while not self._stop.wait(float(self.cfg.heartbeat_s)):
            if not self.beat():
                return

    def check(self) -> None:
        """Raises LeaseLostError once another run has taken the lease over."""
        if self.lost is not None:
            raise LeaseLostError(f"{self.workdir}: this run's lease was taken over by "
                                 f"{describe(self.lost, self.clock.time())}; "
                                 f"stopping so that only one run writes there.")

    def release(self) -> None:
        """Stops the heartbeat and deletes the lease if it is still ours (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        _HELD.pop(self.workdir, None)
        try:
            held = read_lease(self.workdir)
            if held is not None and held["run_id"] == self.record["run_id"]:
                self.path.unlink()
        except Exception as error:  # noqa: BLE001  (the lease then goes stale by itself)
            logging.warning("could not release the lease of %s: %s", self.workdir, error)


class Joined:
    """A non-zero process's side of the lease: process 0 holds it for the run."""

    def check(self) -> None:
        pass

    def release(self) -> None:
        pass


def acquire(workdir: str, cfg, process_index: int, process_count: int, clock: Clock = WALL_CLOCK) -> Lease | Joined:
    """Process 0 takes the workdir's lease (raising LeaseHeldError if a live run holds it); others join."""
    if process_index != 0 or not cfg.enabled:
        return Joined()
    previous = _HELD.pop(str(workdir), None)
    if previous is not None:
        previous.release()
    lease = Lease(workdir, cfg, process_count, clock)
    lease._take()
    lease._thread.start()
    _HELD[str(workdir)] = lease
    atexit.register(lease.release)
    return lease
