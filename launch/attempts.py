"""A relaunched run's history, and the one decision a relauncher makes: try again, or stop.

An attempt ends in one of four ways:

- `done`: `pretrain` wrote `WORKDIR/DONE` (bert_jax/run/completion.py);
- `preempted`: the capacity went away. A host vanished (Ray lost its node or its task),
  a process was killed by a signal, or every process exited 0 without DONE, which is a
  SIGTERM's clean preemption save. The same command resumes from the newest checkpoint;
- `crashed`: a process exited non-zero by itself (a traceback, a config error, a NaN stop).
  Running it again would fail the same way, so it is retried only within `max_failures`
  and only if the run got further than at the previous failure;
- `no_capacity`: no slice came within `--max_wait`.

Pure functions, so the rules are tested without a cluster (tests/test_ray_tpu.py).
"""
from __future__ import annotations

import dataclasses
import json
import time

from bert_jax.storage import paths

ATTEMPTS_FILE = "attempts.jsonl"
OUTCOMES = ("done", "preempted", "crashed", "no_capacity")


@dataclasses.dataclass
class Attempt:
    attempt: int
    started_at: float
    ended_at: float
    outcome: str
    step_reached: int  # the newest committed checkpoint when it ended
    reason: str

    def line(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.started_at))
        return (f"attempt {self.attempt}: started {when} UTC, {self.ended_at - self.started_at:.0f} s, "
                f"{self.outcome} at step {self.step_reached}: {self.reason}")


def classify(exit_codes: list[int | None], host_lost: str, done: bool) -> tuple[str, str]:
    """(outcome, reason) of one attempt: each host's exit code (None: its process never reported), the
    reason a host was lost ("" if none was), and whether DONE exists."""
    if done:
        return "done", "the run wrote DONE"
    if host_lost:
        return "preempted", host_lost
    killed = [i for i, code in enumerate(exit_codes) if code is not None and code < 0]
    if killed:
        return "preempted", f"host {killed[0]}'s process was killed by signal {-exit_codes[killed[0]]}"
    failed = [i for i, code in enumerate(exit_codes) if code]
    if failed:
        return "crashed", f"host {failed[0]}'s process exited with status {exit_codes[failed[0]]}"
    return "preempted", "every process exited 0 without DONE (a preemption save)"


def decide(history: list[Attempt], max_preemptions: int, max_failures: int) -> tuple[bool, str]:
    """(relaunch?, why) after the last attempt of `history`."""
    last = history[-1]
    if last.outcome == "done":
        return False, f"finished at step {last.step_reached}"
    if last.outcome == "no_capacity":
        return False, f"gave up waiting for capacity at step {last.step_reached}"
    if last.outcome == "preempted":
        preemptions = sum(a.outcome == "preempted" for a in history)
        if preemptions > max_preemptions:
            return False, (f"gave up after {preemptions} preemptions (--max_preemptions={max_preemptions}) at step "
                           f"{last.step_reached}")
        return True, f"preemption {preemptions} of at most {max_preemptions}: relaunching from step {last.step_reached}"
    failures = [a for a in history if a.outcome == "crashed"]
    if len(failures) > max_failures:
        return False, (f"crashed ({last.reason}) at step {last.step_reached}; not retried "
                       f"(--max_failures={max_failures})")
    previous = failures[-2].step_reached if len(failures) > 1 else -1
    if last.step_reached <= previous:
        return False, (f"crashed ({last.reason}) at step {last.step_reached}, no further than the previous failure: "
                       f"not retried")
    return True, f"failure {len(failures)} of at most {max_failures}, after progress: relaunching"


def read_attempts(workdir: str) -> list[Attempt]:
    file = paths.fresh(paths.path(workdir) / ATTEMPTS_FILE)
    if not file.exists():
        return []
    return [Attempt(**json.loads(line)) for line in file.read_text().splitlines() if line.strip()]


def write_attempts(workdir: str, history: list[Attempt]) -> None:
    """The whole history, rewritten (an object store has no append)."""
    paths.write_atomically(paths.path(workdir) / ATTEMPTS_FILE,
                           "".join(json.dumps(dataclasses.asdict(a), sort_keys=True) + "\n" for a in history))
