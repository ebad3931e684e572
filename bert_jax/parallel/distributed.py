"""Joining a multi-host run: `jax.distributed.initialize` from `config.distributed` or the environment.

Multi-host JAX is one program run once per host; every process must call this before
anything touches a device (`jax.devices()`, `jax.process_index()`, building arrays).

- Explicit (localhost, or any cluster without a scheduler JAX knows): set
  `distributed.coordinator_address=host:port`, `num_processes`, `process_id`.
- Auto: on a Cloud TPU VM (TPU_WORKER_HOSTNAMES / TPU_WORKER_ID / TPU_ACCELERATOR_TYPE
  in the environment), under SLURM with more than one task, or with
  `distributed.auto=True`, JAX reads everything from the environment. Under SLURM it
  runs one process per *task* and, by default, gives each process the GPU numbered
  by SLURM_LOCALID: launch one task per GPU (`launch/slurm.py` does).

A process that dies (SIGKILL, a lost host) must not leave the others waiting in a collective, nor in
the barriers of a checkpoint save or of JAX's shutdown, which wait for every process. `PeerWatch`, started
by `initialize`, is a thread in each process that bumps a counter of its own in the coordination
service's key-value store every `heartbeat_timeout_s / 10` and reads the others'. A peer whose counter
has not moved for `heartbeat_timeout_s` (by this process's clock: no two hosts' clocks are compared),
or a coordination service that has not answered for as long (process 0 gone), ends this process at
once, with one line naming the lost process and exit status LOST_PEER_STATUS; the relaunch of every
process resumes from the newest checkpoint. JAX's own heartbeat (which aborts a process with a longer
report) is given twice that timeout, as a backstop. A process that ends normally marks its counter
done first, so its peers do not count it as lost.
"""
import atexit
import os
import sys
import threading
import time

import jax
import ml_collections
from absl import logging
from jax.experimental import multihost_utils

# Environment variables whose presence means a TPU VM slice with several workers.
_TPU_ENV = ("TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES")


def default_config() -> ml_collections.ConfigDict:
    """config.distributed of every command: a single process unless told or detected otherwise."""
    c = ml_collections.ConfigDict()
    c.coordinator_address = ""  # "host:port" of process 0; "" = single process or auto
    c.num_processes = 1
    c.process_id = 0
    c.auto = False  # True: jax.distributed.initialize() detects the cluster itself
    c.initialization_timeout_s = 300  # wait this long for every process to join
    # A process silent this long counts as dead: the others stop with an error instead of hanging.
    c.heartbeat_timeout_s = 100
    c.shutdown_timeout_s = 300
    return c


def detected_cluster(environ=os.environ) -> str | None:
    """'tpu' or 'slurm' when the environment describes a multi-process job JAX can join by itself."""
    hosts = next((environ[k] for k in _TPU_ENV if environ.get(k)), "")
    if len([h for h in hosts.split(",") if h.strip()]) > 1:
        return "tpu"
    if int(environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_PROCID" in environ:
        return "slurm"
    return None


def initialize_kwargs(dist_cfg, environ=os.environ) -> dict | None:
    """The arguments for jax.distributed.initialize, or None for a single-process run."""
    timeouts = dict(
        initialization_timeout=int(dist_cfg.initialization_timeout_s),
        # PeerWatch reports a lost process after heartbeat_timeout_s; JAX's own abort is the backstop.
        heartbeat_timeout_seconds=2 * int(dist_cfg.heartbeat_timeout_s),
        shutdown_timeout_seconds=int(dist_cfg.shutdown_timeout_s),
    )
    if dist_cfg.coordinator_address:
        n, i = int(dist_cfg.num_processes), int(dist_cfg.process_id)
        if n < 1 or not 0 <= i < n:
            raise ValueError(
                f"config.distributed.process_id={i} must be in [0, config.distributed.num_processes={n})"
            )
        return dict(coordinator_address=dist_cfg.coordinator_address, num_processes=n, process_id=i, **timeouts)
    if dist_cfg.num_processes > 1:
        raise ValueError(
            f"config.distributed.num_processes={dist_cfg.num_processes} needs "
            f"config.distributed.coordinator_address=HOST:PORT (process 0's address), or distributed.auto=True"
        )
    if dist_cfg.auto or detected_cluster(environ):
        return timeouts  # JAX detects coordinator, process count and id from the environment
    return None


def initialize(dist_cfg) -> None:
    """Joins the run (no-op for one process, or when already joined). Call before touching devices."""
    kwargs = initialize_kwargs(dist_cfg)
    if kwargs is None or jax.distributed.is_initialized():
        return
    logging.info("jax.distributed.initialize(%s)", ", ".join(f"{k}={v}" for k, v in kwargs.items()))
    jax.distributed.initialize(**kwargs)
    logging.info("process %d of %d; %d local / %d global devices",
                 jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())
    if jax.process_count() > 1:
        from jax._src import distributed as jax_distributed  # noqa: PLC0415  (the client JAX joined with)

        PeerWatch(jax_distributed.global_state.client, jax.process_index(), jax.process_count(),
                  float(dist_cfg.heartbeat_timeout_s)).start()


def sync(name: str) -> None:
    """A barrier across all processes (no-op for one): e.g. process 0 has written the tokenizer."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


# The exit status of a process that stops because another one of its run is gone (EX_TEMPFAIL: relaunch them all).
LOST_PEER_STATUS = 75
_KEY = "bert_jax/peer_watch/{}"
_DONE = "done"


class PeerWatch:
    """Ends this process, naming the lost one, when a process of the run stops beating (see the module's doc).

    `client`: the coordination service's client (key_value_set / key_value_try_get). `stop`: what ends the
    process (os._exit, so no barrier or collective is waited for); tests pass their own."""

    def __init__(self, client, process_id: int, num_processes: int, timeout_s: float, stop=None,
                 clock=time.monotonic):
        self.client, self.id, self.timeout_s, self.clock = client, process_id, timeout_s, clock
        self.peers = [i for i in range(num_processes) if i != process_id]
        self.period_s = max(timeout_s / 10, 0.1)
        self.stop = stop or _stop_process
        self._count = 0
        self._finished = threading.Event()
        now = clock()
        self.last_change = {i: (None, now) for i in self.peers}  # peer -> (its counter, when it last moved)
        self.last_answer = now  # when the coordination service last answered

    def start(self) -> "PeerWatch":
        threading.Thread(target=self._beat, name="peer-watch", daemon=True).start()
        threading.Thread(target=self._judge, name="peer-watch-judge", daemon=True).start()
        atexit.register(self.finish)
        return self

    def finish(self, sleep=time.sleep) -> None:
        """This process ends (atexit, after the run or an exception): marks it done, so its peers stop watching it,
        then waits, still judging, until every peer is done too. A run whose peer died often gets here first by an
        exception (a collective that lost its peer's connection), and JAX's shutdown would then wait for the dead
        peer, or abort: the wait ends with the line naming it instead."""
        if self._finished.is_set():
            return
        self._finished.set()  # the beating thread stops: our key now says done
        try:
            self.client.key_value_set(_KEY.format(self.id), _DONE, allow_overwrite=True)
        except Exception:  # noqa: BLE001  (the service is gone: process 0 ended, nothing left to wait for)
            return
        while self.peers:
            answered = self.last_answer
            self.beat_once(write=False)
            if self.last_answer == answered and self.clock() - answered > self.period_s:
                return  # the service stopped answering after we were done: process 0 finished (or is gone)
            line = self.lost()
            if line is not None:
                self.stop(f"{line}; process {self.id} stops rather than wait for it. Relaunch every process: the "
                          f"run resumes from its newest checkpoint.")
                return
            sleep(self.period_s)

    def beat_once(self, write: bool = True) -> None:
        """Bumps our counter (`write`) and reads the peers'. These RPCs may block or fail while the service is gone:
        the judge counts that silence, not this thread."""
        try:
            if write:
                self._count += 1
                self.client.key_value_set(_KEY.format(self.id), str(self._count), allow_overwrite=True)
            seen = {}
            for peer in self.peers:
                try:
                    seen[peer] = self.client.key_value_try_get(_KEY.format(peer))
                except Exception:  # noqa: BLE001  (NOT_FOUND: it has not beaten yet)
                    seen[peer] = None
        except Exception:  # noqa: BLE001  (the service does not answer)
            return
        now = self.clock()
        self.last_answer = now
        for peer, value in seen.items():
            if value == _DONE:
                self.peers.remove(peer)
            elif value != self.last_change[peer][0]:
                self.last_change[peer] = (value, now)

    def _beat(self) -> None:
        while not self._finished.wait(self.period_s):
            self.beat_once()

    def lost(self) -> str | None:
        """The line naming what is lost, or None while every peer beats."""
        now = self.clock()
        if now - self.last_answer > self.timeout_s:
            return (f"process 0 of the run (the coordinator) is lost: the coordination service has not answered "
                    f"for {now - self.last_answer:.0f} s (config.distributed.heartbeat_timeout_s="
                    f"{self.timeout_s:g})")
        for peer in list(self.peers):
            silent = now - self.last_change[peer][1]
            if silent > self.timeout_s:
                return (f"process {peer} of the run is lost: no heartbeat for {silent:.0f} s "
                        f"(config.distributed.heartbeat_timeout_s={self.timeout_s:g})")
        return None

    def _judge(self) -> None:
        while not self._finished.wait(self.period_s):  # after that, finish() judges
            line = self.lost()
            if line is not None:
                self.stop(f"{line}; process {self.id} stops rather than wait for it in a collective. Relaunch "
                          f"every process: the run resumes from its newest checkpoint.")
                return


def _stop_process(line: str) -> None:
    sys.stderr.write(f"bert-jax: {line}\n")
    sys.stderr.flush()
    os._exit(LOST_PEER_STATUS)
