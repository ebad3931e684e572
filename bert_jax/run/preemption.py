"""Noticing that the run must stop (SIGTERM from a spot/preemptible VM or a scheduler).

The loop asks at each step boundary; when it must stop it saves, waits for the write
and returns, so the process exits 0 and the same command resumes. On TPU pods JAX's
preemption sync point makes every host stop at the same step.
"""
import signal
import threading

import jax
from absl import logging
from jax.experimental import multihost_utils


class PreemptionWatch:
    """A context manager: while active, SIGTERM sets a flag instead of killing the process."""

    def __init__(self):
        self._signalled = threading.Event()
        self._previous = None

    def __enter__(self) -> "PreemptionWatch":
        # With several processes, JAX's own notifier catches SIGTERM and the sync point
        # below stops every host at the same step; a handler here would replace JAX's
        # and stop the signalled host alone, leaving the others in a collective save.
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, signum, frame) -> None:
        logging.warning("SIGTERM received: saving a checkpoint at the next step boundary, then exiting")
        self._signalled.set()

    def should_stop(self, step: int) -> bool:
        if self._signalled.is_set():
            return True
        if jax.process_count() == 1:
            return False
        try:  # only available when jax.distributed runs with a preemption service (TPU pods)
            return bool(multihost_utils.reached_preemption_sync_point(step))
        except Exception:  # noqa: BLE001
            return False
