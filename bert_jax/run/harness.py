"""The one harness of every run: pre-training and fine-tuning are `Program`s handed to it with their `Batches`.

It owns what a run does whatever it trains, once its command set the process up (run/process_setup.py): checking
storage before anything is built, the barriers where process 0 writes what the others read, restoring the newest
checkpoint (train state and data iterator) or initialising, the step / log / evaluate / checkpoint loop, the
preemption save (SIGTERM: save at the next step boundary, exit 0, the same command resumes), the end of the data
(batches that may end: its last full batch is the run's last step, evaluated and saved as a last step is), and
cleanup on any exit. What differs,
a run gives as `Hooks`, complete when built: when it evaluates and saves, what its evaluation writes, what its
progress line says, and whether it stops early.
"""
import collections
import dataclasses
from typing import Any, Callable, Iterator, Protocol

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.checkpoint import manager as ckpt
from bert_jax.parallel import distributed
from bert_jax.parallel.mesh import global_batch
from bert_jax.storage import paths, preflight
from bert_jax.storage.workdir import Workdir
from bert_jax.run import determinism, goodput, spike
from bert_jax.run import lease as lease_lib
from bert_jax.run.device_memory import DeviceMemory, planned_peak_bytes
from bert_jax.run.metrics_file import read_rows
from bert_jax.run.metrics_writer import MetricsWriter
from bert_jax.run.preemption import PreemptionWatch
from bert_jax.run.profile_window import ProfileWindow
from bert_jax.run.step_clock import DATA_BOUND_SHARE, StepClock


class NonFiniteLossError(RuntimeError):
    pass


def check_storage(config, workdir: str) -> lease_lib.Lease | lease_lib.Joined:
    """Before anything is built: the workdir's store exists and is writable (a missing bucket fails naming its
    URL and is never created; the inputs were checked with the config); then a local workdir is made, and the run
    takes its lease (run/lease.py: a second live run there stops here). `run` releases it."""
    determinism.check_xla_flags(config)
    preflight.check_writable(workdir, jax.process_index())
    checkpoints = Workdir(workdir).checkpoints
    if checkpoints.exists():  # a resume's checkpoints folder too: a read-only one would fail only at the first save
        preflight.check_writable(str(checkpoints), jax.process_index())
    if not paths.is_remote(workdir):  # (a bucket has no folders to make)
        paths.path(workdir).mkdir(parents=True, exist_ok=True)
    lease = lease_lib.acquire(workdir, config.lease, jax.process_index(), jax.process_count())
    distributed.sync("lease_taken")  # the other hosts write nothing before process 0 holds the workdir
    return lease


def written_by_process_0(name: str, write: Callable[[], Any], read: Callable[[], Any]):
    """Process 0 writes (and gets write's value); the others wait at a barrier named `name`, then read."""
    value = write() if jax.process_index() == 0 else None
    distributed.sync(name)
    return value if jax.process_index() == 0 else read()


def nonfinite_steps(pending: list, nan_policy: str) -> list[int]:
    """Steps among `pending` whose loss or gradient was not finite; under policy `stop`, raises at the first."""
    bad = [step for step, m in pending if float(m["nonfinite"]) > 0]
    if bad and nan_policy == "stop":
        raise NonFiniteLossError(
            f"non-finite loss or gradient at step {bad[0]}; the update was not applied and no checkpoint "
            f"holds it. Set config.train.nan_policy=skip to skip such steps instead."
        )
    return bad


def host_metrics(pending: list, nan_policy: str) -> dict:
    """Means of the device metrics of the steps since the last log, over the steps that were applied."""
    pending = jax.device_get(pending)  # one transfer for all the steps since the last log
    bad = nonfinite_steps(pending, nan_policy)
    host = [m for step, m in pending if step not in bad] or [pending[-1][1]]
    out = {f"train/{k}": float(np.mean([m[k] for m in host])) for k in host[0] if k != "nonfinite"}
    out["train/skipped_steps"] = float(len(bad))
    return out


def headline(row: dict, split: str, names: tuple[str, ...]) -> str:
    return " | ".join(f"{name} {row[f'{split}/{name}']:.4f}" for name in ("loss",) + tuple(names))


class Hooks(Protocol):
    """What a run does its own way, called by `run` at each step boundary."""

    def started(self, step: int, state, writer: MetricsWriter) -> None:
        """Before the first step of this process (a fine-tuning run validates the untrained model here)."""

    def logs_at(self, step: int) -> bool: ...

    def logged(self, step: int, row: dict) -> None:
        """Adds to a train row (rate, epoch, speed) and prints the progress line."""

    def evaluates_at(self, step: int) -> bool: ...

    def evaluate(self, step: int, state, writer: MetricsWriter) -> bool:
        """Evaluates and writes the rows; True stops the run here (early stopping)."""

    def saves_at(self, step: int) -> bool: ...

    def saved(self, step: int, writer: MetricsWriter) -> None: ...

    def closing(self, writer: MetricsWriter) -> None:
        """On any exit, before the metrics are closed (a last plot)."""

    def data_ended(self, step: int) -> dict:
        """The data ended after `step` (asked only of batches that may end): says why, and returns
        metrics for that step's last row."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Program:
    """What the harness runs: a jitted step over a mesh and the state a fresh run starts from, built complete from
    the config by one function (pre-training's bert_jax/train/program.py, fine-tuning's bert_jax/finetune/run.py).

    The batches come apart (`Batches`): the program the planner compiles is exactly the one that trains.
    """

    mesh: Any
    rules: Any
    abstract_state: Any  # ShapeDtypeStructs carrying their shardings
    state_shardings: Any
    data_sharding: Any
    train_step: Callable  # jitted (state, global batch, frozen) -> (state, device metrics); state is donated
    init: Callable[[], Any]  # the state a fresh run starts from (pre-trained weights in), initialised on its shards
    # The steps' `frozen` input, params they read and never train (a distillation teacher's), on their shards:
    # read on the first call, the same arrays after; {} without. Never part of the state, so never checkpointed.
    # The harness calls it first, outside the mesh context (a workdir's checkpoint restores outside one).
    load_frozen: Callable[[], Any] = dict


@dataclasses.dataclass(frozen=True)
class Batches:
    """This host's training batches: checkpointed with the state, so a resume replays none."""

    iterator: Iterator[dict]
    # Restored only from a checkpoint after this step: a stage's iterator is new at its start
    # (bert_jax/train/stages.py), and the checkpoint there holds the stage before's.
    restored_after: int = 0
    # The iterator may end before the last step (a mixture source with on_exhausted="stop"): on several
    # hosts, whose shares end at different batches, they then agree at every step whether one ended.
    may_end: bool = False


@dataclasses.dataclass
class Outcome:
    state: Any
    start: int  # the step this process resumed from
    step: int  # the last step run
    stopped_early: bool = False
    preempted: bool = False
    data_ended: bool = False  # the iterator ended: `step` is the last full batch's (a finished run)


class Rewound(Exception):  # noqa: N818  (not an error: the caller plans again)
    """The newest checkpoint could not be read, and the one restored instead is at or before the start of the span
    being trained (`Batches.restored_after`): it belongs to the stage before, whose config and iterator differ. The
    unreadable one is set aside by then, so planning the stages again from the checkpoints resumes as a relaunch
    would (bert_jax/train/loop.py)."""

    def __init__(self, step: int, newest: int, start: int):
        super().__init__(f"the newest checkpoint, step {newest}, could not be read; step {step}, restored instead, is "
                         f"at or before this span's start at step {start}")
        self.step = step


def restore_or_init(program: Program, batches: Batches, manager):
    """The newest checkpoint's state (and the iterator's position), or a fresh one; Rewound when an unreadable
    newest checkpoint sent the restore back to the span before this one."""
    latest = manager.latest_step()
    iterator = batches.iterator if latest is None or latest > batches.restored_after else None
    with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules):
        state = ckpt.restore_latest(manager, program.abstract_state, iterator)
        if state is None:
            return program.init()
    step = int(state.step)
    if step < latest and step <= batches.restored_after:
        raise Rewound(step, latest, batches.restored_after)
    return state


def next_batch(batches: Batches) -> dict | None:
    """This host's next batch, or None once the data ended on any host (batches.may_end; otherwise the
    iterator's end is an error)."""
    if not batches.may_end:
        return next(batches.iterator)
    try:
        batch, ended = next(batches.iterator), False
    except StopIteration:
        batch, ended = None, True
    if jax.process_count() > 1:
        ended = bool(np.any(multihost_utils.process_allgather(np.int32(ended))))
    return None if ended else batch


class StepsAhead:
    """How far the host may run ahead of the device: at most `limit` dispatched steps not yet computed.

    JAX dispatches a step and returns at once, so the host loop runs ahead of the computation
    until something reads a result: by about 30 steps between two logs on a loaded CPU. A
    SIGTERM is noticed at the host's next step, and its save waits for every step dispatched
    before it: a spot TPU's 30 s of notice would go to steps, not to the save. Blocking on the
    result of the step `limit` back keeps the device fed (the next steps are queued) and the
    save at most `limit` steps away.
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.in_flight: collections.deque = collections.deque()

    def dispatched(self, metrics) -> None:
        """After a step is dispatched: waits for the one `limit` steps before it."""
        self.in_flight.append(metrics)
        while len(self.in_flight) > self.limit:
            jax.block_until_ready(self.in_flight.popleft())


@dataclasses.dataclass(frozen=True, kw_only=True)
class Instruments:
    """What keeps and measures one start of a run, opened by `run` once the state is restored: the
    clock every second is charged to, the checkpoints, the metrics, this start's goodput record, the profiler
    window, the device memory readings and the spike detector (None when off)."""

    clock: StepClock
    manager: Any
    writer: MetricsWriter
    recorder: goodput.Recorder
    profile: ProfileWindow
    memory: DeviceMemory
    spikes: spike.Spikes | None


@dataclasses.dataclass
class Marks:
    """Where the loop stands between steps: the device metrics not yet logged, as (step, metrics), and the last
    steps evaluated and saved."""

    pending: list
    evaluated: int
    saved: int
    data_bound_said: bool = False  # the data-bound warning is given once a start


def run(program: Program, batches: Batches, hooks: Hooks, workdir: str, config, last_step: int,
        lease=None, end_step: int | None = None) -> Outcome:
    """Restores or initialises, then trains `program` on `batches` to `last_step` (or a preemption, or the hooks'
    stop), saving per the hooks, at the last step and at a stop. The saves already started complete on any exit,
    and then the workdir's `lease` (from check_storage) is released; a lease taken over stops the run.

    `end_step`: the run's own end (default `last_step`), which is evaluated whatever the hooks' cadence; a
    `last_step` before it is a stop (a test's interruption), saved but evaluated only when due, as a kill's is.

    Where the time goes: a clock (run/step_clock.py) charges every second since the process started to one activity;
    each logged row gets its `time/*` split, and this start's goodput record (run/goodput.py) its totals. A profiler
    window (config.train.profile, run/profile_window.py) traces the steps it names. A loss spike (config.train.spike,
    run/spike.py) rolls the run back to its last good checkpoint, past the batches that led to it.

    The stages below read top to bottom; each is a function of what its signature names."""
    end_step = last_step if end_step is None else end_step
    clock = StepClock("startup", goodput.start_origin())  # imports, devices, the program, the data: start-up
    manager = ckpt.make_manager(paths.absolute(Workdir(workdir).checkpoints), config.checkpoint)
    recorder = writer = profile = None  # what `close_run` closes, once opened
    try:
        # ---------------------------------------------------------------------------------- restore or initialise
        # First and outside the mesh context: a teacher's checkpoint restores outside one, and `init` may reuse it.
        frozen = program.load_frozen()
        with clock.timing("startup" if manager.latest_step() is None else "restore"):  # a fresh init is start-up
            state = restore_or_init(program, batches, manager)
        start = int(state.step)
        say_resumed(workdir, start, last_step)

        # ---------------------------------------------------------------------------------- what this start keeps
        recorder = goodput.Recorder(workdir, clock, start, active=jax.process_index() == 0)
        writer = MetricsWriter(workdir, config, start if start else -1)  # a fresh start rewrites its step-0 rows
        profile = ProfileWindow(config.train.get("profile"), workdir, start, last_step)
        tools = Instruments(clock=clock, manager=manager, writer=writer, recorder=recorder, profile=profile,
                            memory=DeviceMemory(jax.local_devices()), spikes=spikes_for(config, workdir, start))

        # ---------------------------------------------------------------------------------- train
        with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules), PreemptionWatch() as watch:
            with clock.timing("evaluation"):  # a fine-tuning run validates the untrained model here
                hooks.started(start, state, tools.writer)
            clock.switch("other")  # the loop's own work, between the activities it times
            return train(program, batches, hooks, tools, watch, config, state, frozen, last_step, end_step, lease)
    finally:
        # ---------------------------------------------------------------------------------- close, on any exit
        close_run(manager, clock, hooks, lease, recorder, writer, profile)


def say_resumed(workdir: str, start: int, last_step: int) -> None:
    """The log lines of a resume: what the stop cost, from the starts' goodput records (run/goodput.py), and a
    checkpoint already at the end."""
    if start and jax.process_index() == 0:
        logging.info("resuming from the checkpoint of step %d: %d step(s) trained past it before the stop are "
                     "trained again", start, goodput.steps_replayed(workdir, start))
    if start >= last_step:
        logging.info("the checkpoint is already at step %d: nothing to train", start)


def train(program: Program, batches: Batches, hooks: Hooks, tools: Instruments, watch: PreemptionWatch, config,
          state, frozen, last_step: int, end_step: int, lease=None) -> Outcome:
    """The step loop from `state`'s step to `last_step`: per step, the lease, the batch, the dispatch, a spike's
    roll-back, then what the step is due (`finish_step`). Ends at the last step, a stop, a preemption or the data's
    end."""
    start = int(state.step)
    outcome = Outcome(state, start, start)
    marks = Marks(pending=[], evaluated=start, saved=start)  # the start needs neither an evaluation nor a save
    ahead = StepsAhead(config.train.max_steps_ahead)
    step = start
    while step < last_step:
        step += 1
        if lease is not None:
            lease.check()
        with tools.profile.annotate(step):  # the step's span in a trace: its data wait and its dispatch
            with tools.clock.timing("data_wait"):
                batch = next_batch(batches)
            if batch is not None:
                state, metrics = dispatch(program, state, batch, frozen, step, step == start + 1, tools)
        if batch is None:  # the data ended: the step before is the run's last
            logging.warning("the training data ended before step %d: the run ends at step %d", step, step - 1)
            extra = hooks.data_ended(step - 1)
            if step - 1 > start:
                finish_step(step - 1, state, True, extra, marks, hooks, tools, watch, batches, config, end_step,
                            ahead.limit, ended=True)
            return Outcome(state, start, step - 1, data_ended=True)
        marks.pending.append((step, metrics))
        with tools.clock.timing("device"):
            ahead.dispatched(metrics)
        tools.profile.after_step(step, metrics)
        if tools.spikes is not None and (hooks.logs_at(step) or hooks.saves_at(step) or step == last_step):
            found = tools.spikes.first_spike(jax.device_get(marks.pending))  # before a row or a save holds it
            if found is not None:
                with tools.clock.timing("restore"):
                    state, step = roll_back(found, marks, program, batches, tools)
                continue
        stop, preempted = finish_step(step, state, step == last_step, {}, marks, hooks, tools, watch, batches,
                                      config, end_step, ahead.limit)
        outcome = Outcome(state, start, step, stopped_early=stop, preempted=preempted)
        if preempted:
            logging.warning("preempted: checkpoint of step %d saved; run the same command to resume", step)
        if preempted or stop:
            break
    return outcome


def dispatch(program: Program, state, batch: dict, frozen, step: int, first: bool, tools: Instruments):
    """The jitted step, queued: (state, device metrics). A start's `first` is compiled and run whole: start-up, not
    step time."""
    with tools.clock.timing("compile" if first else "dispatch"):
        step_batch = global_batch(batch, program.data_sharding)
        if first and tools.memory.measurable and hasattr(program.train_step, "lower"):
            # The executable the call below reuses (jit caches it): its compiler's memory analysis.
            tools.memory.planned = planned_peak_bytes(program.train_step.lower(state, step_batch, frozen).compile())
        state, metrics = program.train_step(state, step_batch, frozen)
        if first:
            jax.block_until_ready(metrics)
    if first:
        tools.memory.measure(step)
    return state, metrics


def finish_step(step: int, state, is_last: bool, extra: dict, marks: Marks, hooks: Hooks, tools: Instruments,
                watch: PreemptionWatch, batches: Batches, config, end_step: int, steps_ahead: int,
                ended: bool = False) -> tuple[bool, bool]:
    """Logs, evaluates and saves what `step` is due (everything for a last step): (stop, preempted)."""
    log_step(step, is_last, extra, marks, hooks, tools, config)
    stop = False
    if marks.evaluated < step and (hooks.evaluates_at(step) or (is_last and step >= end_step) or ended):
        with tools.clock.timing("evaluation"):
            stop, marks.evaluated = hooks.evaluate(step, state, tools.writer), step
    preempted = watch.should_stop(step)
    if preempted:
        logging.warning("preempted: saving the checkpoint of step %d (the device was at most %d steps behind)",
                        step, steps_ahead)
    if marks.saved < step and (hooks.saves_at(step) or is_last or preempted or stop):
        save_step(step, state, marks, hooks, tools, batches, config.train.nan_policy)
    return stop, preempted


def log_step(step: int, is_last: bool, extra: dict, marks: Marks, hooks: Hooks, tools: Instruments, config) -> None:
    """The row of the steps since the last log, when `step` logs (or is the last): their mean metrics, where the time
    went, the device memory; the progress line; once a start, the data-bound warning. `extra` alone otherwise."""
    if not (marks.pending and (hooks.logs_at(step) or is_last)):
        if extra:
            tools.writer.write(step, extra)
        return
    with tools.clock.timing("device"):  # the only block on the device the log adds: its metrics
        jax.block_until_ready(marks.pending[-1][1])
    row = host_metrics(marks.pending, config.train.nan_policy)
    times, data_share = tools.clock.window_row(len(marks.pending))
    row.update(times)
    row.update(tools.memory.measure(step))
    marks.pending = []
    if tools.spikes is not None:
        tools.spikes.logged(step, row)
    # Recorded before the console line and the row: a kill between them counts the step as replayed (once too
    # often at worst), never one fewer than the log showed trained (the soak's find).
    tools.recorder.logged(step)
    hooks.logged(step, row)
    if data_share > DATA_BOUND_SHARE and not marks.data_bound_said:
        marks.data_bound_said = True
        logging.warning(data_bound_line(config, step, data_share))
    tools.writer.write(step, {**row, **extra})


def save_step(step: int, state, marks: Marks, hooks: Hooks, tools: Instruments, batches: Batches,
              nan_policy: str) -> None:
    """Saves `step`'s checkpoint (state and data iterator) and syncs the metrics, unless a spike or a non-finite
    step since the last log would be in it."""
    # A save the spike check did not see coming (a preemption's, a stop's) never holds a spike: the next start
    # resumes from the checkpoint before it, and meets (and rolls back) the spike again.
    if (tools.spikes is not None and marks.pending
            and tools.spikes.first_spike(jax.device_get(marks.pending)) is not None):
        logging.warning("a loss spike since step %d is not saved: the next start resumes from the checkpoint of "
                        "step %d", marks.saved, marks.saved)
        return
    nonfinite_steps(marks.pending, nan_policy)  # a NaN step stops the run before it is saved
    if tools.spikes is not None:
        tools.spikes.saved(step, tools.manager.all_steps())  # the window a rollback or a resume to `step` starts from
    with tools.clock.timing("checkpoint"):
        ckpt.save(tools.manager, step, state, batches.iterator)
        tools.writer.sync()  # a bucket gets the metrics up to this step (see metrics_writer.py)
        hooks.saved(step, tools.writer)
    tools.recorder.saved(step)
    marks.saved = step


def roll_back(found: tuple[int, float, float], marks: Marks, program: Program, batches: Batches,
              tools: Instruments):
    """Back to the newest checkpoint before the spike `found`, past its batches: (state, its step)."""
    ckpt.wait_until_finished(tools.manager)
    good = tools.spikes.good_step(found[0], sorted(tools.manager.all_steps()))
    jax.block_until_ready(marks.pending[-1][1])
    restored = ckpt.restore_step(tools.manager, good, program.abstract_state, batches.iterator)
    for _ in range(found[0] - good):  # the batches that led to the spike: the data position moves past them
        next_batch(batches)
    marks.pending, marks.evaluated, marks.saved = [], min(marks.evaluated, good), good
    tools.writer.rewind(good)
    tools.recorder.rolled_back(good)
    tools.spikes.rolled_back(found, good)
    return restored, good


def spikes_for(config, workdir: str, start: int) -> spike.Spikes | None:
    """config.train.spike's detector, its counts read from the rows up to `start`, its window from `start`'s
    checkpoint (run/spike.py); None when off."""
    spike_cfg = config.train.get("spike")
    if spike_cfg is None or not spike_cfg.factor:
        return None
    rows = [r for r in read_rows(Workdir(workdir).metrics_jsonl) if r["step"] <= start] if start else []
    return spike.Spikes(spike_cfg, rows, workdir, start)


def close_run(manager, clock: StepClock, hooks: Hooks, lease, recorder: goodput.Recorder | None = None,
              writer: MetricsWriter | None = None, profile: ProfileWindow | None = None) -> None:
    """On any exit: the profiler window, the saves under way, the checkpoint manager, a last plot, the metrics, the
    lease, then this start's goodput record (last, so that its span holds all of this start's work)."""
    try:
        if profile is not None:
            profile.close()
        with clock.timing("checkpoint"):
            ckpt.wait_until_finished(manager)
    finally:
        try:
            manager.close()
            if writer is not None:
                try:
                    hooks.closing(writer)
                finally:
                    writer.close()
        finally:
            try:
                if lease is not None:
                    lease.release()
            finally:
                if recorder is not None:
                    recorder.close()


def data_bound_line(config, step: int, share: float) -> str:
    """The one line a data-bound run gets: the share, and the keys that feed the device faster."""
    workers = config.data.get("worker_count", None)
    return (f"the input pipeline holds the steps back: {100 * share:.0f} % of the wall time up to step {step} waited "
            f"for the next batch (time/data_wait_s). More loader processes (config.data.worker_count"
            f"{'' if workers is None else f', now {workers}'}), or shards tokenized ahead of the run (`bert-jax "
            f"prepare`, then config.data.source=prepared), feed it faster.")
