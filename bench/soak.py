"""A tiny pre-training killed with SIGKILL at random moments, and faults injected between kills, on local disk or in
an emulated bucket: does every resume go on as if the run had never stopped?

    nice -n 15 python bench/soak.py --kills=50 [--storage=gs] [--seed=0] [--until=HH:MM]

The run: configs/tiny.py shrunk to a micro model (as tests/test_pretrain.py's micro_config), 40 steps in two stages
(the mask rate 0.15, then 0.3 from step 21: a stage switch recompiles the step), a checkpoint every 5 steps, an
evaluation every 10. One uninterrupted run is the reference. Then episodes: each a fresh workdir, the same command
launched again and again until it writes DONE, each launch but the last (at most --kills_per_episode of them) ended
by a SIGKILL that a seeded random generator aims at one of four moments, in turn:

  step        a random moment of the steps (after a random step's log line)
  checkpoint  while a save is being written (a step folder not yet committed is seen, then killed)
  eval        during an evaluation (after the log line of a step that evaluates, before its eval line)
  switch      during the stage switch (between stage 1's last eval and stage 2's first step)

What a kill hit is read from the run's log and the checkpoint folder at the moment of the kill, not from what was
aimed at; the report counts both. Between kills, one fault per episode, in turn:

  half_line        a half-written last line appended to metrics.jsonl
  half_checkpoint  the largest file of the newest committed checkpoint cut in half (as a host dying mid-write
                   leaves it on a file system without atomic renames)
  unwritable       the checkpoints folder refuses writes for one launch (a read-only bind mount on local disk; the
                   bucket's proxy answering 403 to uploads under checkpoints/)
  disk_full        the workdir's file system fills up during a launch (local disk only: the workdirs live on a
                   size-limited tmpfs that is filled to the last byte; a bucket has no disk)

A fault either resumes exactly, or the launch stops and its last line names the fault; the next launch, with the
fault removed, resumes. At each episode's end the run's metrics.jsonl is compared with the reference's: every train
loss (and eval loss) equal bit for bit, exactly one row per logged step and kind, DONE written once (never by a
killed or failed launch). Any difference is printed and counted. The figures of a soak go in docs/results/soak.md.

The emulated bucket: fake-gcs-server behind tests/cloud_emulators.py's FaultyProxy. XLA's persistent compilation
cache (in --out) is shared by every launch, so a launch costs its start-up, not its compiles. Root is needed for the
tmpfs and the bind mount; without it the disk_full fault is skipped and `unwritable` is a chmod (which root ignores).
"""
from __future__ import annotations

import collections
import hashlib
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from absl import app, flags

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from soak_faults import Storage, Unwritable, fill_disk, inject_half_checkpoint, inject_half_line  # noqa: E402

KILLS = flags.DEFINE_integer("kills", 50, "SIGKILLs to deliver in all (episodes are added until they are)")
STORAGE = flags.DEFINE_enum("storage", "local", ["local", "gs", "s3"], "where the workdirs live")
SEED = flags.DEFINE_integer("seed", 0, "seeds the kill moments and the fault order")
OUT = flags.DEFINE_string("out", "/tmp/bert_jax_soak", "scratch folder: reference, logs, XLA cache, tmpfs mount")
UNTIL = flags.DEFINE_string("until", "", "UTC time HH:MM after which no more kills are aimed (the episode under way "
                                         "is finished unkilled and checked); '' = none")
FAULTS = flags.DEFINE_bool("faults", True, "inject one fault per episode between kills")
PER_EPISODE = flags.DEFINE_integer("kills_per_episode", 6, "kills in one episode before its launch runs to DONE (a "
                                   "run resumed near its end is killed again and again there otherwise)")

NUM_STEPS, SWITCH_STEP, EVAL_EVERY, SAVE_EVERY = 40, 20, 10, 5
OVERRIDES = [
    "--config.model.vocab_size=1024", "--config.data.vocab_size=1024", "--config.model.hidden_size=32",
    "--config.model.num_heads=2", "--config.model.intermediate_size=64", "--config.model.scan_layers=True",
    "--config.model.attention_dropout_rate=0.1", "--config.data.max_seq_length=64",
    "--config.data.max_predictions_per_seq=10", "--config.data.num_eval_batches=2",
    "--config.train.global_batch_size=8", f"--config.train.num_steps={NUM_STEPS}", "--config.train.warmup_steps=2",
    "--config.train.log_every_steps=1", f"--config.train.eval_every_steps={EVAL_EVERY}",
    f"--config.checkpoint.every_steps={SAVE_EVERY}", "--config.logging.peak_flops_per_device=1e11",
    f"--config.data.mask_rate_schedule=((0,0.15),({SWITCH_STEP},0.3))",
]
KINDS = ("step", "checkpoint", "eval", "switch")
FAULT_KINDS = ("half_line", "half_checkpoint", "unwritable", "disk_full")

STEP_LINE = re.compile(r"\] step (\d+)/\d+ \|")
EVAL_LINE = re.compile(r"\] eval step (\d+) \|")
STAGE2_LINE = re.compile(r"\] stage 2 of 2")
START_LINE = re.compile(r"\] starting at step (\d+)")
REPLAY_LINE = re.compile(r"\] resuming from the checkpoint of step (\d+): (\d+) step\(s\) trained past it")


# ------------------------------------------------------------------------------------------------------------------
# One launch: the command, its log read as it is written, what it was doing at a moment.
# ------------------------------------------------------------------------------------------------------------------

def command(workdir: str) -> list[str]:
    return [sys.executable, "-m", "bert_jax.commands.pretrain", "--config=configs/tiny.py", f"--workdir={workdir}",
            *OVERRIDES]


class Launch:
    """The run started once; its log lines, timestamped, kept and written to `log_path`."""

    started: list["Launch"] = []  # every launch, in order

    def __init__(self, workdir: str, log_path: Path, env: dict):
        self.workdir = workdir
        Launch.started.append(self)
        self.lines: list[tuple[float, str]] = []
        self.changed = threading.Condition()
        self.log = open(log_path, "w", buffering=1)
        self.proc = subprocess.Popen(command(workdir), cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.log.write(line)
            with self.changed:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, pattern: re.Pattern, want=None) -> float | None:
        """The time the first line matching `pattern` (its group 1 == want, if given) was read; None if the run
        ended first. (No time limit: on a loaded machine a launch's start-up took 15 minutes.)"""
        seen = 0
        with self.changed:
            while True:
                for t, line in self.lines[seen:]:
                    m = pattern.search(line)
                    if m and (want is None or int(m.group(1)) == want):
                        return t
                seen = len(self.lines)
                if not self.reader.is_alive():
                    return None
                self.changed.wait(0.5)

    def phase(self) -> str:
        """What the log says the run was doing: startup, step, eval or switch (from the lines read so far)."""
        phase = "startup"
        for _, line in self.lines:
            if STAGE2_LINE.search(line):
                phase = "switch"
            elif START_LINE.search(line):
                phase = "switch" if phase == "switch" else "step"
            elif (m := EVAL_LINE.search(line)):
                phase = "switch" if int(m.group(1)) == SWITCH_STEP else "step"
            elif (m := STEP_LINE.search(line)):
                phase = "eval" if int(m.group(1)) % EVAL_EVERY == 0 else "step"
        return phase

    def kill(self) -> bool:
        if self.proc.poll() is not None:
            return False
        self.proc.send_signal(signal.SIGKILL)
        return True

    def finish(self) -> int:
        rc = self.proc.wait()
        self.reader.join(10)
        self.log.close()
        return rc

    def last_step(self) -> int:
        """The last step whose log line this launch printed (0: none)."""
        return max([int(m.group(1)) for _, line in self.lines if (m := STEP_LINE.search(line))], default=0)

    def replay_said(self) -> tuple[int, int] | None:
        """(restored step, steps it says it replays) from this launch's first resume line."""
        return next(((int(m.group(1)), int(m.group(2))) for _, line in self.lines if (m := REPLAY_LINE.search(line))),
                    None)

    def last_line(self) -> str:
        return next((line for _, line in reversed(self.lines) if line.strip()), "")


# ------------------------------------------------------------------------------------------------------------------
# Checks.
# ------------------------------------------------------------------------------------------------------------------

def read_rows(storage: Storage, workdir: str) -> list[dict]:
    metrics = storage.paths.fresh(workdir) / "metrics.jsonl"
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def row_key(row: dict) -> tuple[int, str]:
    return row["step"], "eval" if any(k.startswith("eval/") for k in row) else "train"


def differences(rows: list[dict], reference: list[dict]) -> list[str]:
    """Where `rows` differ from the reference's: a missing, extra or repeated row, a loss not equal bit for bit."""
    found = []
    keys = collections.Counter(row_key(r) for r in rows)
    found += [f"row {k} written {n} times" for k, n in sorted(keys.items()) if n > 1]
    want = {row_key(r): r for r in reference}
    have = {row_key(r): r for r in rows}
    found += [f"row {k} missing" for k in sorted(set(want) - set(have))]
    found += [f"row {k} not in the reference" for k in sorted(set(have) - set(want))]
    for k in sorted(set(want) & set(have)):
        for metric in ("train/loss", "eval/loss", "train/mlm_accuracy", "train/grad_norm"):
            if metric in want[k] and want[k][metric] != have[k].get(metric):
                found.append(f"row {k} {metric}: {have[k].get(metric)!r} != reference {want[k][metric]!r}")
    return found


# ------------------------------------------------------------------------------------------------------------------
# The soak.
# ------------------------------------------------------------------------------------------------------------------

def replay_lines(launches: list[Launch], bucket: bool) -> tuple[int, list[str]]:
    """Checks each resume's log line ("N step(s) trained past it ... are trained again") against what the launches
    before it logged: the steps past the restored one that any of them trained. A launch may have recorded one step
    more than it printed (a kill between the two); in a bucket the records are written at most every 30 s, so
    fewer may be known. Returns (lines checked, mismatches)."""
    checked, wrong, spans = 0, [], []
    for launch in launches:
        said = launch.replay_said()
        start = said[0] if said else 0
        if said:
            restored, replayed = said
            # The steps past the restored one that some launch before trained: each is trained again once (a launch
            # that started past it counts too: a corrupt newest checkpoint sends the restore back behind its start).
            expected = max([last - restored for _, last in spans if last > restored], default=0)
            ok = expected - (0 if not bucket else expected) <= replayed <= expected + 1
            checked += 1
            if not ok:
                wrong.append(f"restored step {restored}: the log says {replayed} replayed, the launches before "
                             f"trained {expected} past it")
        spans.append((start, launch.last_step()))
    return checked, wrong


def reference_run(storage: Storage, out: Path) -> tuple[list[dict], dict]:
    """The uninterrupted run (on local disk whatever --storage is: losses do not depend on where they are stored),
    and its durations of an evaluation and of the stage switch, which the kills aimed at them are drawn within."""
    workdir = out / "reference"
    stamp = workdir.parent / "reference.json"  # the command and the code it ran: a soak with the same reuses it
    same = stamp.exists() and json.loads(stamp.read_text()) == [*OVERRIDES, code_digest()]
    if same and (workdir / "DONE").exists():
        print(f"reusing the reference run in {workdir}", flush=True)
        durations = dict(eval_s=1.0, switch_s=10.0)  # until a launch of this soak measures them
    else:
        if workdir.exists():
            shutil.rmtree(workdir)
        launch = Launch(str(workdir), out / "reference.log", storage.env)
        rc = launch.finish()
        if rc != 0 or not (workdir / "DONE").exists():
            raise SystemExit(f"the reference run failed (exit {rc}); see {out / 'reference.log'}")
        stamp.write_text(json.dumps([*OVERRIDES, code_digest()]))
        durations = observed_durations(launch, {})
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return rows, durations


def code_digest() -> str:
    """sha256 of the code a run executes (bert_jax, data_pipelines, configs): a reference from other code is stale
    (a change elsewhere in the tree moved losses by their last bit, which a stale reference reports as differences)."""
    digest = hashlib.sha256()
    for folder in ("bert_jax", "data_pipelines", "configs"):
        for file in sorted((REPO / folder).rglob("*.py")):
            digest.update(str(file.relative_to(REPO)).encode() + file.read_bytes())
    return digest.hexdigest()


def observed_durations(launch: Launch, durations: dict) -> dict:
    """`durations` updated with what `launch` took for an evaluation (its last one, compiled programs loaded from
    the cache unless it was the first ever) and for the stage switch: the newest figures follow the machine's load."""
    times = {}
    for t, line in launch.lines:
        for name, pattern in (("step", STEP_LINE), ("eval", EVAL_LINE)):
            if (m := pattern.search(line)):
                times.setdefault((name, int(m.group(1))), t)
    evals = [times[("eval", s)] - times[("step", s)] for s in range(EVAL_EVERY, NUM_STEPS + 1, EVAL_EVERY)
             if ("eval", s) in times and ("step", s) in times]
    durations = dict(durations)
    if evals:
        durations["eval_s"] = evals[-1]
    if ("step", SWITCH_STEP + 1) in times and ("eval", SWITCH_STEP) in times:
        durations["switch_s"] = times[("step", SWITCH_STEP + 1)] - times[("eval", SWITCH_STEP)]
    return durations


def aim(launch: Launch, storage: Storage, workdir: str, kind: str, resume: int, rng: random.Random,
        durations: dict) -> bool:
    """Waits for the moment `kind` picks (drawn by `rng`) and SIGKILLs the run there; False if it ended first."""
    ahead = [s for s in range(resume + 1, NUM_STEPS + 1)]
    if kind == "switch":
        if launch.wait_for(EVAL_LINE, SWITCH_STEP) is None:
            return False
        time.sleep(rng.uniform(0, durations["switch_s"]))
    elif kind == "eval":
        step = rng.choice([s for s in ahead if s % EVAL_EVERY == 0])
        if launch.wait_for(STEP_LINE, step) is None:
            return False
        time.sleep(rng.uniform(0, durations["eval_s"]))
    elif kind == "checkpoint":
        step = rng.choice([s for s in ahead if s % SAVE_EVERY == 0][:3])
        if launch.wait_for(STEP_LINE, step - 1) is None:
            return False
        while launch.proc.poll() is None and launch.last_step() <= step:  # until the step after the save
            if storage.checkpoint_state(workdir)[1]:
                break
            time.sleep(0.002 if storage.kind == "local" else 0.05)
        time.sleep(rng.uniform(0, 0.01))
    else:
        step = rng.choice(ahead[:12])
        if launch.wait_for(STEP_LINE, step) is None:
            return False
        time.sleep(rng.uniform(0, 0.05))
    return True


def kinds_ahead(resume: int) -> list[str]:
    kinds = ["step", "checkpoint", "eval"]
    if resume < SWITCH_STEP:
        kinds.append("switch")
    return kinds


def soak(argv) -> None:
    del argv
    out = Path(OUT.value) / STORAGE.value
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    deadline = None
    if UNTIL.value:
        hh, mm = map(int, UNTIL.value.split(":"))
        now = time.gmtime()
        deadline = time.time() + ((hh * 60 + mm) - (now.tm_hour * 60 + now.tm_min)) * 60 - now.tm_sec
    rng = random.Random(SEED.value)
    storage = Storage(STORAGE.value, out)
    started = time.time()
    try:
        reference, durations = reference_run(storage, Path(OUT.value))
        print(f"reference: {len(reference)} rows; eval takes up to {durations['eval_s']:.2f} s, the stage switch "
              f"{durations['switch_s']:.2f} s", flush=True)
        tokenizer = Path(OUT.value) / "reference" / "tokenizer"
        aimed, hit = collections.Counter(), collections.Counter()
        faults = collections.Counter()
        fault_outcomes: list[str] = []
        all_differences: list[str] = []
        launches = episodes = kills = replay_checked = 0
        replay_wrong: list[str] = []
        fault_order = [f for f in FAULT_KINDS if not (f == "disk_full" and storage.tmpfs is None)]
        turn = 0
        while kills < KILLS.value and (deadline is None or time.time() < deadline):
            episodes += 1
            workdir = storage.new_workdir(f"e{episodes}")
            storage.copy_tree(tokenizer, f"{workdir}/tokenizer")
            fault = fault_order[(episodes - 1) % len(fault_order)] if FAULTS.value and fault_order else None
            cycle, done, killed_before_fault, last_logged = 0, False, 0, 0
            while not done:
                cycle += 1
                launches += 1
                committed, _ = storage.checkpoint_state(workdir)
                resume = committed[-1] if committed else 0
                out_of_time = (kills >= KILLS.value or cycle > PER_EPISODE.value
                               or (deadline is not None and time.time() >= deadline))
                if cycle > 200:
                    raise SystemExit(f"episode {episodes} did not finish in 200 launches: {workdir}")
                log = out / "logs" / f"e{episodes}-c{cycle}.log"
                # A fault comes after the episode's second kill (there are checkpoints and rows to damage).
                inject = fault if fault and killed_before_fault == 2 and resume < NUM_STEPS else None
                note = ""
                if inject == "half_line":
                    inject_half_line(storage, workdir)
                    note = "appended a half line"
                elif inject == "half_checkpoint" and len(committed) >= 2:
                    note = f"cut {inject_half_checkpoint(storage, workdir)} in half"
                elif inject == "half_checkpoint":
                    inject = None
                if inject in ("unwritable", "disk_full"):
                    launch = None
                    if inject == "unwritable":
                        with Unwritable(storage, workdir) as held:
                            launch = Launch(workdir, log, storage.env)
                            rc = launch.finish()
                        note = held.how
                    else:
                        launch = Launch(workdir, log, storage.env)
                        step = rng.randint(resume + 1, min(resume + 8, NUM_STEPS))
                        ballast = None
                        if launch.wait_for(STEP_LINE, step) is not None:
                            ballast = fill_disk(storage.tmpfs)
                        rc = launch.finish()
                        if ballast is not None:
                            ballast.unlink()
                        note = f"filled the tmpfs after step {step}"
                    faults[inject] += 1
                    outcome = "resumed" if rc == 0 else f"stopped (exit {rc}): {launch.last_line()[:300]}"
                    fault_outcomes.append(f"{inject} ({note}): {outcome}")
                    print(f"  e{episodes} c{cycle} fault {inject} ({note}): {outcome}", flush=True)
                    fault = None
                    done = rc == 0 and storage.paths.fresh(f"{workdir}/DONE").exists()
                    continue
                if inject:
                    faults[inject] += 1
                    fault = None
                launch = Launch(workdir, log, storage.env)
                if out_of_time:
                    rc = launch.finish()
                else:
                    kind = rng.choice(kinds_ahead(resume)) if turn % 2 else KINDS[(turn // 2) % len(KINDS)]
                    if kind == "switch" and resume >= SWITCH_STEP:
                        kind = "step"
                    turn += 1
                    reached = aim(launch, storage, workdir, kind, resume, rng, durations)
                    writing = storage.checkpoint_state(workdir)[1] if reached else False
                    phase = launch.phase()
                    if reached and launch.kill():
                        kills += 1
                        killed_before_fault += 1
                        aimed[kind] += 1
                        hit["checkpoint" if writing else phase] += 1
                    rc = launch.finish()
                    durations = observed_durations(launch, durations)
                    if rc == -signal.SIGKILL:
                        if storage.paths.fresh(f"{workdir}/DONE").exists() and not _done_complete(storage, workdir):
                            all_differences.append(f"e{episodes} c{cycle}: DONE written before the last step")
                        continue
                if inject:
                    outcome = "resumed" if rc == 0 else f"stopped (exit {rc}): {launch.last_line()[:300]}"
                    fault_outcomes.append(f"{inject} ({note}): {outcome}")
                    print(f"  e{episodes} c{cycle} fault {inject} ({note}): {outcome}", flush=True)
                if rc != 0:
                    all_differences.append(f"e{episodes} c{cycle}: exit {rc} without a fault: {launch.last_line()}")
                    print(f"  e{episodes} c{cycle}: exit {rc}: {launch.last_line()[:300]} (log {log})", flush=True)
                    if not inject:
                        raise SystemExit(1)
                    continue
                done = storage.paths.fresh(f"{workdir}/DONE").exists()
            checked, wrong = replay_lines([x for x in Launch.started if x.workdir == workdir], storage.kind != "local")
            replay_checked += checked
            replay_wrong += [f"e{episodes}: {w}" for w in wrong]
            found = differences(read_rows(storage, workdir), reference)
            if not _done_complete(storage, workdir):
                found.append("DONE does not hold the last step")
            all_differences += [f"e{episodes}: {d}" for d in found]
            print(f"episode {episodes}: {cycle} launches, {kills} kills so far, {len(found)} differences; "
                  f"{time.time() - started:.0f} s", flush=True)
            if not found:
                storage.remove(workdir)
        summary = dict(storage=STORAGE.value, seed=SEED.value, kills=kills, launches=launches, episodes=episodes,
                       aimed=dict(aimed), hit=dict(hit), faults=dict(faults), fault_outcomes=fault_outcomes,
                       differences=all_differences, replay_lines_checked=replay_checked,
                       replay_lines_wrong=replay_wrong, seconds=round(time.time() - started),
                       seconds_per_launch=round((time.time() - started) / max(launches, 1), 1))
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        print(json.dumps(summary, indent=2))
        print(f"{kills} kills in {launches} launches ({episodes} episodes) on {STORAGE.value}: "
              f"{len(all_differences)} differences")
        if all_differences:
            raise SystemExit(1)
    finally:
        storage.close()


def _done_complete(storage: Storage, workdir: str) -> bool:
    record = json.loads(storage.paths.fresh(f"{workdir}/DONE").read_text())
    return record.get("step") == NUM_STEPS


if __name__ == "__main__":
    app.run(soak)
