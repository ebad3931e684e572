"""A run's goodput across its whole life: the share of its wall time that trained steps it kept.

Every start of a run (a process, or a stage within one) writes one small JSON file, DIR/goodput/<start>.json, and
rewrites it whole at each logged step, each checkpoint save and its exit (an object store has no append: one object
per start, replaced, never appended to). It holds the start's wall-clock span and its seconds per activity from the
harness's clock (bert_jax/run/step_clock.py), which is always in exactly one activity, so they add up to the span.
`account` puts the starts together, oldest first.

The categories follow ML Goodput Measurement's (AI-Hypercomputer/ml-goodput-measurement, its README's "Badput
Breakdown Details" and `BadputType`); that library records to Cloud Logging, this needs no cloud:

| here | ML Goodput Measurement | what |
|---|---|---|
| productive steps | goodput | dispatching steps and waiting for the device, for steps the run kept |
| start-up | TPU_INITIALIZATION, TRAINING_PREP | process start (or the stage before's end) to the first step: imports, devices, the program, the tokenizer, the data pipeline, a fresh run's init |
| compiles | PROGRAM_STARTUP | each start's first step: tracing, compiling and running it |
| restores | UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME | reading the newest checkpoint and the data iterator's position |
| checkpoint saves | UNPRODUCTIVE_CHECKPOINT_SAVE_TIME | the time the loop spends in a save (orbax writes the rest in the background) |
| replayed steps | WASTED_PROGRESS_FROM_DISRUPTION | steps trained after the checkpoint the next start restored: trained twice |
| rolled back (spikes) | WASTED_PROGRESS_FROM_DISRUPTION | steps a loss spike rolled back (config.train.spike, run/spike.py): trained twice |
| between starts | INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION | a start's last record to the next start: the kill, the relaunch, a queue |
| data waits | DATA_LOADING_SYNC | waiting for the next batch |
| evaluation | CUSTOM_BADPUT_EVENTS | evaluation (and a fine-tuning run's validation) |
| other | OTHER | the host's own work in the loop: metrics, logs, plots, the profiler |

Every part is measured; none is what is left of the wall time, so their sum (the report prints it) checks the clock:
it equals the wall time from the first start to the last record. A start killed hard (SIGKILL, a lost host) loses
the time after its last record: it shows under "between starts", and its steps up to that record count as replayed.

Readers: `bert-jax inspect --from=DIR --mode=goodput` (`report`), `bert-jax sweep summary` (a goodput column), and
`steps_replayed`, which says how many steps a resume trains again.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import time

from absl import logging

from bert_jax import UserError
from bert_jax.storage import paths
from bert_jax.storage.workdir import GOODPUT_DIR, Workdir

# (key in the report, its label, ML Goodput Measurement's BadputType or "goodput"), in the report's order.
CATEGORIES = (
    ("productive", "productive steps", "goodput"),
    ("startup", "start-up", "TPU_INITIALIZATION + TRAINING_PREP"),
    ("compile", "compiles (first steps)", "PROGRAM_STARTUP"),
    ("restore", "restores", "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"),
    ("checkpoint", "checkpoint saves", "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"),
    ("replayed", "replayed steps", "WASTED_PROGRESS_FROM_DISRUPTION"),
    ("rolled_back", "rolled back (spikes)", "WASTED_PROGRESS_FROM_DISRUPTION"),
    ("between_starts", "between starts", "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"),
    ("data_wait", "data waits", "DATA_LOADING_SYNC"),
    ("evaluation", "evaluation", "CUSTOM_BADPUT_EVENTS"),
    ("other", "other host work", "OTHER"),
)
# The clock's activities that are step time (productive unless replayed).
STEP_ACTIVITIES = ("dispatch", "device")
# Saved steps whose productive time a record keeps (a resume restores one of the newest).
KEPT_SAVES = 16


def process_start_time() -> float:
    """When this process started (time.time() scale), read from /proc on Linux; else now."""
    try:  # (local system files, never a user's path)
        stat = paths.path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks since boot
        boot = next(int(line.split()[1]) for line in paths.path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return datetime.datetime.now().timestamp()


@dataclasses.dataclass
class StartRecord:
    """One start of a run: its span, the steps it trained (`start_step` restored, `step` the last it recorded
    complete) and its seconds per clock activity. `step_seconds_at_save`: step time (STEP_ACTIVITIES) accumulated
    up to each saved step, so that a later start's restore point splits the steps kept from those replayed."""

    started_at: float
    start_step: int
    recorded_at: float = 0.0
    step: int = 0
    seconds: dict = dataclasses.field(default_factory=dict)
    step_seconds_at_save: dict = dataclasses.field(default_factory=dict)
    # Loss spikes rolled back (run/spike.py), and the step time of the steps they trained again.
    rollbacks: int = 0
    rolled_back_seconds: float = 0.0
    host: str = dataclasses.field(default_factory=socket.gethostname)
    pid: int = dataclasses.field(default_factory=os.getpid)

    def __post_init__(self):
        self.step = self.step or self.start_step

    @property
    def step_seconds(self) -> float:
        return sum(self.seconds.get(name, 0.0) for name in STEP_ACTIVITIES)

    @property
    def name(self) -> str:
        when = datetime.datetime.fromtimestamp(self.started_at, datetime.timezone.utc)
        return f"{when:%Y%m%dT%H%M%S.%f}Z-{self.host}-{self.pid}.json"


def write(workdir: str, record: StartRecord) -> None:
    """Replaces this start's file whole (process 0 only: the caller asks)."""
    paths.write_atomically(Workdir(workdir).goodput / record.name, json.dumps(dataclasses.asdict(record)) + "\n")


def read(workdir: str) -> list[StartRecord]:
    """The run's starts, oldest first; a file that does not parse is skipped, warned."""
    folder = paths.fresh(Workdir(workdir).goodput)
    if not folder.exists():
        return []
    fields = {f.name for f in dataclasses.fields(StartRecord)}
    records = []
    for file in folder.iterdir():
        if not file.name.endswith(".json"):
            continue
        try:
            raw = json.loads(file.read_text())
            records.append(StartRecord(**{k: v for k, v in raw.items() if k in fields}))
        except (ValueError, TypeError) as error:
            logging.warning("goodput record %s does not parse (%s): skipped", file, error)
    return sorted(records, key=lambda r: r.started_at)


def replayed_by(record: StartRecord, restored_step: int) -> tuple[int, float]:
    """(steps, seconds) of `record`'s training that a later start restoring `restored_step` trains again."""
    if restored_step >= record.step:
        return 0, 0.0
    steps = record.step - max(restored_step, record.start_step)
    if restored_step <= record.start_step:
        return steps, record.step_seconds
    kept = record.step_seconds_at_save.get(str(restored_step))
    if kept is None:  # not a save of this start's record: shared in proportion to the steps
        trained = max(record.step - record.start_step, 1)
        kept = record.step_seconds * (restored_step - record.start_step) / trained
    return steps, max(record.step_seconds - kept, 0.0)


def steps_replayed(workdir: str, restored_step: int) -> int:
    """How many steps a start that restored `restored_step` trains again: those the starts recorded before it reached
    past that step (call it before this start's first record). 0 for a fresh run or a clean resume (a SIGTERM's)."""
    return max([r.step - restored_step for r in read(workdir)] + [0])


@dataclasses.dataclass
class Account:
    seconds: dict  # CATEGORIES' keys -> seconds
    wall_s: float  # the first start to the last record
    starts: int
    replayed_steps: int
    first_step: int  # the step the first start began at
    last_step: int
    rollbacks: int = 0  # loss spikes rolled back (run/spike.py)

    @property
    def goodput(self) -> float:
        return self.seconds["productive"] / self.wall_s if self.wall_s > 0 else 0.0


def account(records: list[StartRecord]) -> Account | None:
    """The starts (oldest first) put together; None for a run with none."""
    if not records:
        return None
    seconds = {key: 0.0 for key, _, _ in CATEGORIES}
    replayed_steps = 0
    for index, record in enumerate(records):
        later = [r.start_step for r in records[index + 1:]]
        steps, lost = replayed_by(record, min(later)) if later else (0, 0.0)
        lost = min(lost, record.step_seconds - record.rolled_back_seconds)  # a rolled-back second is not lost twice
        replayed_steps += steps
        seconds["replayed"] += lost
        seconds["rolled_back"] += record.rolled_back_seconds
        seconds["productive"] += record.step_seconds - lost - record.rolled_back_seconds
        for key in ("startup", "compile", "restore", "checkpoint", "data_wait", "evaluation", "other"):
            seconds[key] += record.seconds.get(key, 0.0)
        if index:
            seconds["between_starts"] += max(record.started_at - records[index - 1].recorded_at, 0.0)
    wall = records[-1].recorded_at - records[0].started_at
    return Account(seconds, wall, len(records), replayed_steps, records[0].start_step,
                   max(r.step for r in records), sum(r.rollbacks for r in records))


def report(workdir: str) -> list[str]:
    """`bert-jax inspect --mode=goodput`'s lines; the last is `goodput NN.N %`."""
    if not paths.path(workdir).is_dir():
        raise UserError(f"--from={workdir}: no such workdir")
    result = account(read(workdir))
    if result is None:
        raise UserError(f"--from={workdir} holds no goodput records ({GOODPUT_DIR}/): a run writes one at each start, "
                        f"from its first")
    lines = [f"{workdir}: {result.starts} start(s), steps {result.first_step} -> {result.last_step}, "
             f"wall time {result.wall_s:.1f} s",
             f"  {'':<26}{'seconds':>12}{'share':>9}   ML Goodput Measurement"]
    for key, label, theirs in CATEGORIES:
        value = result.seconds[key]
        if key == "replayed":
            label = f"replayed steps ({result.replayed_steps})"
        elif key == "rolled_back":
            label = f"rolled back ({result.rollbacks})"
        share = 100 * value / result.wall_s if result.wall_s > 0 else 0.0
        lines.append(f"  {label:<26}{value:>12.1f}{share:>8.1f} %   {theirs}")
    total = sum(result.seconds.values())
    lines.append(f"  {'sum of the parts':<26}{total:>12.1f}{(100 * total / result.wall_s if result.wall_s else 0):>8.1f} %")
    lines.append(f"goodput {100 * result.goodput:.1f} %")
    return lines


def summary_column(workdir, run: dict | None = None) -> dict:
    """`sweep summary`'s goodput column for a point's workdir: {"goodput": "NN.N %"}, None before it started."""
    result = account(read(str(workdir)))
    return {"goodput": None if result is None else f"{100 * result.goodput:.1f} %"}


# Where the next start in this process begins its clock: a staged run's stage, or a test's next run, starts when the
# start before it ended, not when the process did.
_previous_end: float | None = None


def start_origin() -> float:
    """The time.time() this start's clock begins at: the process's start, or the end of the start before it here."""
    return process_start_time() if _previous_end is None else _previous_end


class Recorder:
    """This start's record, kept current in DIR/goodput/ from the harness's clock (`clock`: a StepClock). Process 0
    writes; a bucket's object is replaced at most every `min_interval_s`, besides saves and the end."""

    def __init__(self, workdir: str, clock, start_step: int, active: bool, min_interval_s: float | None = None):
        self.workdir, self.clock, self.active = workdir, clock, active
        self.record = StartRecord(started_at=clock.wall_origin, start_step=start_step)
        self.min_interval_s = (30.0 if paths.is_remote(workdir) else 0.0) if min_interval_s is None else min_interval_s
        self._written_at = float("-inf")

    def logged(self, step: int) -> None:
        self.record.step = step
        self._write(force=False)

    def saved(self, step: int) -> None:
        self.record.step = max(self.record.step, step)
        self._refresh()
        marks = self.record.step_seconds_at_save
        marks[str(step)] = self.record.step_seconds
        for old in sorted(marks, key=int)[:-KEPT_SAVES]:
            del marks[old]
        self._write(force=True)

    def rolled_back(self, good: int) -> None:
        """A spike rolled the run back to the save of step `good`: the step time since then was spent on steps trained
        again. That save's mark moves to now, so a second rollback to it, or a later start restoring it, counts only
        what came after."""
        self._refresh()
        marks = self.record.step_seconds_at_save
        self.record.rolled_back_seconds += max(self.record.step_seconds - marks.get(str(good), 0.0), 0.0)
        marks[str(good)] = self.record.step_seconds
        self.record.rollbacks += 1
        self.record.step = good
        self._write(force=True)

    def close(self) -> None:
        global _previous_end
        self._write(force=True)
        _previous_end = self.record.recorded_at

    def _refresh(self) -> None:
        self.clock.elapsed()  # charges the running activity up to now
        self.record.seconds = dict(self.clock.totals)
        # The wall clock, not the sum of the parts: the two agree only if the clock charged every second once.
        self.record.recorded_at = time.time()

    def _write(self, force: bool) -> None:
        self._refresh()
        if not self.active or (not force and self.record.recorded_at - self._written_at < self.min_interval_s):
            return
        write(self.workdir, self.record)
        self._written_at = self.record.recorded_at
