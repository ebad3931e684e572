"""An hour of configs/tiny.py at full rate with everything a real run has on: does anything grow?

    nice -n 5 python bench/long_haul.py --minutes=60 [--out=/tmp/bert_jax_long_haul]

A run lasts days; kills, faults and resumes are soaked (bench/soak.py), but what only time shows is not: memory that
creeps, files or threads that pile up, a workdir that fills a disk, a step that slows. This runs one pre-training of
configs/tiny.py (the 2-layer BERT, batch 32, seq 128) with what a real run has on: an evaluation every
--eval_every steps, a checkpoint every --save_every steps with checkpoint.max_to_keep=3, the downstream probe (the
smoke suite's SST-2, fine-tuned from the current params every --probe_every steps), grain worker processes
(--workers), TensorBoard, wandb offline and the plots. Its step count is out of reach: the run is stopped with SIGTERM
(a preemption: it saves and exits 0) after --minutes.

Every --sample_s seconds it samples the run's process tree (the trainer, its grain workers, wandb's service):
resident memory (RSS), open file descriptors and threads; the workdir's size, split into the checkpoints, the probes
and the rest; the size of every file the run appends to (metrics.jsonl, TensorBoard's events, wandb's run file and
logs, goodput, the console log); the steps trained and their step time (perf/step_time_s, the median of the rows
logged since the sample before); and the 1-minute load average, since the machine is shared.

After the warm-up (--warmup_minutes: compiles, the first checkpoints and probes) it fits a line to each and prints the
slopes against the goals:

  resident memory   grows <= 1 % per hour (the fitted slope over the mean), judged on the samples taken between
                    downstream probes where there are probes (a sample inside one holds its working set)
  step time         slower by <= 5 % over the window at a constant load: log(step time) fitted on time and
                    log(load average), since a shared machine's load moves step time more than anything the run
                    does (the raw fit, end against start, is printed too)
  open files        flat: the medians of the window's halves at most 1 descriptor apart (saves and probes open
                    and close some: spikes a straight line would read as growth)
  threads           flat: the same, at most 1 thread apart
  workdir           bounded: the checkpoints folder never larger than max_to_keep checkpoints and one being saved
                    (orbax writes the new one before it deletes the oldest), and the rest growing at most linearly
                    in the steps (logs)

Writes OUT/long_haul.json (every sample and the summary) and OUT/long_haul.png; docs/results/long-haul.md holds
an hour's figures.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from absl import app, flags

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import finetune_data  # noqa: E402  (tests/finetune_data.py: a learnable sentiment task, no download)

MINUTES = flags.DEFINE_float("minutes", 60.0, "how long the run trains before it is stopped (SIGTERM)")
WARMUP = flags.DEFINE_float("warmup_minutes", -1.0, "samples before this are not fitted; -1: min(10, minutes / 4)")
SAMPLE_S = flags.DEFINE_float("sample_s", 30.0, "seconds between samples")
OUT = flags.DEFINE_string("out", "/tmp/bert_jax_long_haul", "scratch folder: the workdir, the probe's data, the log, "
                                                             "the JSON and the PNG (emptied first)")
EVAL_EVERY = flags.DEFINE_integer("eval_every", 200, "config.train.eval_every_steps")
SAVE_EVERY = flags.DEFINE_integer("save_every", 100, "config.checkpoint.every_steps (max_to_keep=3)")
PROBE_EVERY = flags.DEFINE_integer("probe_every", 600, "config.eval.downstream_every_steps (a multiple of eval_every)")
WORKERS = flags.DEFINE_integer("workers", 1, "config.data.worker_count: grain worker processes")
REPORT = flags.DEFINE_string("report", "", "a long_haul.json written before: fit and plot its samples again, run nothing")

RSS_GOAL_PCT_PER_H, STEP_DRIFT_GOAL_PCT = 1.0, 5.0
MAX_TO_KEEP = 3
# Files the run appends to (or rewrites, growing), by a name relative to the workdir; wandb's are found under it.
APPENDED = ("metrics.jsonl", "config_history.jsonl")


def command(workdir: Path, glue: Path) -> list[str]:
    return [sys.executable, "-m", "bert_jax.commands.pretrain", "--config=configs/tiny.py", f"--workdir={workdir}",
            "--config.train.num_steps=10000000", "--config.train.log_every_steps=10",
            f"--config.train.eval_every_steps={EVAL_EVERY.value}", f"--config.checkpoint.every_steps={SAVE_EVERY.value}",
            f"--config.checkpoint.max_to_keep={MAX_TO_KEEP}", "--config.eval.downstream_suite=smoke",
            f"--config.eval.downstream_data_dir={glue}", "--config.eval.downstream_tasks=sst2",
            f"--config.eval.downstream_every_steps={PROBE_EVERY.value}", f"--config.data.worker_count={WORKERS.value}",
            "--config.logging.wandb_mode=offline", "--config.logging.tensorboard=True", "--config.logging.plots=True"]


def write_sst2(root: Path) -> Path:
    """The probe's task in GLUE's layout: SST-2 only (config.eval.downstream_tasks=sst2), 256 train and 64 dev rows."""
    for split, n, seed in (("train", 256, 0), ("dev", 64, 1)):
        path = root / "SST-2" / f"{split}.tsv"
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = finetune_data.sentiment_rows(n, seed)
        path.write_text("sentence\tlabel\n" + "".join(f"{r['sentence']}\t{int(r['label'] == 'pos')}\n" for r in rows))
    return root


# ------------------------------------------------------------------------------------------------------------------
# One sample: the process tree, the workdir, the rows logged since the sample before.
# ------------------------------------------------------------------------------------------------------------------

def tree_figures(root: psutil.Process) -> dict:
    """RSS, open file descriptors and threads summed over `root` and its descendants (gone ones skipped)."""
    rss = fds = threads = count = 0
    by_process = {}  # "<name> <pid>" -> RSS: which one grows, if one does
    for proc in [root] + root.children(recursive=True):
        try:
            with proc.oneshot():
                mine = proc.memory_info().rss
                by_process[f"{proc.name()} {proc.pid}"] = mine
                rss += mine
                fds += proc.num_fds()
                threads += proc.num_threads()
                count += 1
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return dict(rss_bytes=rss, open_fds=fds, threads=threads, processes=count, rss_by_process=by_process)


def folder_bytes(folder: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:  # a checkpoint being replaced
                continue
    return total


def appended_files(workdir: Path, log: Path) -> dict:
    """Sizes of the files the run appends to: metrics, config history, TensorBoard's events, wandb's run file and
    logs, the goodput records, the console log."""
    sizes = {"console.log": log.stat().st_size if log.exists() else 0}
    for name in APPENDED:
        if (workdir / name).exists():
            sizes[name] = (workdir / name).stat().st_size
    for folder in ("tensorboard", "wandb", "goodput"):
        for path in sorted((workdir / folder).rglob("*")) if (workdir / folder).exists() else ():
            if path.is_file() and not path.is_symlink():
                sizes[str(path.relative_to(workdir))] = path.stat().st_size
    return sizes


class RowReader:
    """The train rows metrics.jsonl gained since the last call."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def new_rows(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            f.seek(self.offset)
            text = f.read()
        complete = text[:text.rfind("\n") + 1]
        self.offset += len(complete.encode())
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


def sample(root: psutil.Process, workdir: Path, log: Path, rows: RowReader, t0: float) -> dict:
    new = [r for r in rows.new_rows() if "perf/step_time_s" in r]
    sizes = appended_files(workdir, log)
    total = folder_bytes(workdir)
    checkpoints, probes = folder_bytes(workdir / "checkpoints"), folder_bytes(workdir / "downstream")
    return dict(
        # The machine's available memory: under pressure the kernel reclaims a process's file-backed pages and its
        # RSS falls, which a fit would read as a leak's opposite.
        t_s=time.time() - t0, load_1m=os.getloadavg()[0], available_bytes=psutil.virtual_memory().available,
        **tree_figures(root),
        step=max((r["step"] for r in new), default=None),
        step_time_s=float(np.median([r["perf/step_time_s"] for r in new])) if new else None,
        workdir_bytes=total, checkpoint_bytes=checkpoints, probe_bytes=probes,
        rest_bytes=total - checkpoints - probes, appended=sizes, appended_bytes=sum(sizes.values()),
    )


# ------------------------------------------------------------------------------------------------------------------
# The fit after the warm-up, against the goals.
# ------------------------------------------------------------------------------------------------------------------

def fit(hours: np.ndarray, values: np.ndarray) -> tuple[float, float]:
    """(slope per hour, intercept) of the least-squares line."""
    slope, intercept = np.polyfit(hours, values, 1)
    return float(slope), float(intercept)


def slope_error(hours: np.ndarray, values: np.ndarray) -> float:
    """The standard error of the fitted slope: how far the samples' scatter (saves, evals, a probe's pages faulted
    back after the trim) leaves it from the true one."""
    _, cov = np.polyfit(hours, values, 1, cov=True)
    return float(np.sqrt(cov[0, 0]))


def summarise(samples: list[dict], warmup_s: float) -> dict:
    window = [s for s in samples if s["t_s"] >= warmup_s]
    timed = [s for s in window if s["step_time_s"] is not None]
    if len(window) < 3 or len(timed) < 3:
        raise SystemExit(f"{len(window)} samples after the warm-up of {warmup_s:.0f} s: too few to fit; run longer")
    hours = np.array([s["t_s"] for s in window]) / 3600
    span_h = hours[-1] - hours[0]
    out = {"window_s": [window[0]["t_s"], window[-1]["t_s"]], "samples": len(window)}

    rss = np.array([s["rss_bytes"] for s in window], float)
    slope, _ = fit(hours, rss)
    out["rss"] = dict(mean_mb=rss.mean() / 2**20, slope_mb_per_h=slope / 2**20,
                      slope_error_mb_per_h=slope_error(hours, rss) / 2**20,
                      pct_per_h=100 * slope / rss.mean(), goal_pct_per_h=RSS_GOAL_PCT_PER_H)
    # A sample taken while a probe fine-tunes holds the probe's working set (its model, data and programs, freed when
    # it ends); whether a sample lands in one is chance. The goal is judged between probes, where a leak would stay.
    between = np.array([s.get("in_probe") is False for s in window])
    if between.sum() >= 3 and not between.all():
        slope_b, _ = fit(hours[between], rss[between])
        mean_b = rss[between].mean()
        out["rss"].update(between_probes_samples=int(between.sum()), between_probes_mean_mb=mean_b / 2**20,
                          between_probes_slope_mb_per_h=slope_b / 2**20, between_probes_pct_per_h=100 * slope_b / mean_b,
                          between_probes_slope_error_mb_per_h=slope_error(hours[between], rss[between]) / 2**20)
    judged = out["rss"].get("between_probes_pct_per_h", out["rss"]["pct_per_h"])
    out["rss"]["ok"] = judged <= RSS_GOAL_PCT_PER_H

    t_hours = np.array([s["t_s"] for s in timed]) / 3600
    step_time = np.array([s["step_time_s"] for s in timed])
    load = np.array([s["load_1m"] for s in timed])
    slope, intercept = fit(t_hours, step_time)
    start, end = intercept + slope * t_hours[0], intercept + slope * t_hours[-1]
    # Step time against time and load together, log-linear (a process's share of the cores falls as the load
    # rises): log(step time) = a + b t + c log(load). exp(b x window) - 1 is the drift at a constant load.
    design = np.stack([np.ones_like(t_hours), t_hours, np.log(np.maximum(load, 0.1))], axis=1)
    (_, b, c), *_ = np.linalg.lstsq(design, np.log(step_time), rcond=None)
    out["step_time"] = dict(
        mean_s=float(step_time.mean()), start_s=start, end_s=end, drift_pct=100 * (end - start) / start,
        load_mean=float(load.mean()), load_min=float(load.min()), load_max=float(load.max()),
        load_elasticity=float(c), drift_at_constant_load_pct=float(100 * np.expm1(b * (t_hours[-1] - t_hours[0]))),
        goal_pct=STEP_DRIFT_GOAL_PCT)
    # A slowdown is what time would show; a run that speeds up as the machine empties is no failure.
    out["step_time"]["ok"] = out["step_time"]["drift_at_constant_load_pct"] <= STEP_DRIFT_GOAL_PCT

    half = len(window) // 2
    for key in ("open_fds", "threads", "processes"):
        values = np.array([s[key] for s in window], float)
        slope, _ = fit(hours, values)
        # Flat: the halves' medians at most one apart (a save's or a probe's threads come and go, spikes a fit reads
        # as growth; a pool made once, at the first probe, is one more thread for good, not a leak: a leak adds one
        # per save or per probe).
        medians = float(np.median(values[:half])), float(np.median(values[half:]))
        out[key] = dict(first=int(values[0]), last=int(values[-1]), min=int(values.min()), max=int(values.max()),
                        fitted_growth=slope * span_h, half_medians=medians, ok=medians[1] - medians[0] <= 1.0)

    ckpt = np.array([s["checkpoint_bytes"] for s in window], float)
    # max_to_keep checkpoints most of the time (the median), one more while a save is under way: orbax writes the new
    # one before it deletes the oldest.
    bound = np.median(ckpt) * (MAX_TO_KEEP + 1) / MAX_TO_KEEP * 1.02
    out["checkpoints"] = dict(first_half_max_mb=ckpt[:half].max() / 2**20, second_half_max_mb=ckpt[half:].max() / 2**20,
                              median_mb=float(np.median(ckpt)) / 2**20, bound_mb=bound / 2**20,
                              ok=bool(ckpt.max() <= bound))
    steps = np.array([s["step"] if s["step"] is not None else np.nan for s in window], float)
    steps = np.maximum.accumulate(np.nan_to_num(steps, nan=np.nanmin(steps)))
    trained = steps[-1] - steps[0]
    for key in ("rest_bytes", "appended_bytes", "probe_bytes"):
        values = np.array([s[key] for s in window], float)
        growth = values[-1] - values[0]
        out[key] = dict(first_mb=values[0] / 2**20, last_mb=values[-1] / 2**20, mb_per_h=fit(hours, values)[0] / 2**20,
                        bytes_per_step=growth / trained if trained else None)
    per_file = {}
    first, last = window[0]["appended"], window[-1]["appended"]
    for name in sorted(set(first) | set(last)):
        grew = last.get(name, 0) - first.get(name, 0)
        per_file[name] = dict(last_bytes=last.get(name, 0), bytes_per_step=grew / trained if trained else None)
    out["appended_files"] = per_file
    out["steps_in_window"] = int(trained)
    # Linear growth of the logs: bytes per step no larger in the window's second half than in its first.
    rest = np.array([s["appended_bytes"] for s in window], float)
    first_rate = (rest[half] - rest[0]) / max(steps[half] - steps[0], 1)
    second_rate = (rest[-1] - rest[half]) / max(steps[-1] - steps[half], 1)
    out["logs_linear"] = dict(first_half_bytes_per_step=first_rate, second_half_bytes_per_step=second_rate,
                              ok=bool(second_rate <= 1.25 * first_rate + 1))
    return out


def print_summary(s: dict) -> None:
    r, t = s["rss"], s["step_time"]
    print(f"window {s['window_s'][0] / 60:.1f} to {s['window_s'][1] / 60:.1f} min, {s['samples']} samples, "
          f"{s['steps_in_window']} steps")
    print(f"resident memory  {r['mean_mb']:.0f} MB mean, {r['slope_mb_per_h']:+.1f} +- {r['slope_error_mb_per_h']:.1f} "
          f"MB/h = {r['pct_per_h']:+.2f} %/h "
          f"(goal <= {r['goal_pct_per_h']} %/h)  {'ok' if r['ok'] else 'GROWS'}")
    if "between_probes_pct_per_h" in r:
        print(f"  between probes {r['between_probes_mean_mb']:.0f} MB mean, {r['between_probes_slope_mb_per_h']:+.1f} +- "
              f"{r['between_probes_slope_error_mb_per_h']:.1f} MB/h "
              f"= {r['between_probes_pct_per_h']:+.2f} %/h over {r['between_probes_samples']} samples (the goal's)")
    print(f"step time        {t['start_s'] * 1e3:.0f} -> {t['end_s'] * 1e3:.0f} ms fitted, drift {t['drift_pct']:+.1f} %; "
          f"load {t['load_mean']:.1f} mean (range {t['load_min']:.1f}-{t['load_max']:.1f}, step time ~ load^"
          f"{t['load_elasticity']:.2f}); at a constant load {t['drift_at_constant_load_pct']:+.1f} % "
          f"(goal: slower by <= {t['goal_pct']} %)  {'ok' if t['ok'] else 'DRIFTS'}")
    for key in ("open_fds", "threads", "processes"):
        v = s[key]
        print(f"{key:<16} {v['first']} -> {v['last']} (range {v['min']}-{v['max']}), halves' medians "
              f"{v['half_medians'][0]:.0f} and {v['half_medians'][1]:.0f}, fitted growth {v['fitted_growth']:+.2f}  "
              f"{'flat' if v['ok'] else 'GROWS'}")
    c = s["checkpoints"]
    print(f"checkpoints      max {c['first_half_max_mb']:.1f} MB (first half) vs {c['second_half_max_mb']:.1f} MB "
          f"(second), median {c['median_mb']:.1f}; bound {c['bound_mb']:.1f} (one save more than max_to_keep)  "
          f"{'bounded' if c['ok'] else 'GROWS'}")
    for key in ("appended_bytes", "probe_bytes", "rest_bytes"):
        v = s[key]
        per_step = "" if v["bytes_per_step"] is None else f", {v['bytes_per_step']:.0f} B/step"
        print(f"{key:<16} {v['first_mb']:.2f} -> {v['last_mb']:.2f} MB ({v['mb_per_h']:+.2f} MB/h{per_step})")
    g = s["logs_linear"]
    print(f"logs             {g['first_half_bytes_per_step']:.0f} then {g['second_half_bytes_per_step']:.0f} B/step  "
          f"{'linear' if g['ok'] else 'FASTER THAN LINEAR'}")


def plot(samples: list[dict], warmup_s: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = np.array([s["t_s"] for s in samples]) / 60
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))

    def panel(ax, title, series, ylabel):
        for label, values in series:
            ax.plot(minutes, values, label=label, marker=".", markersize=3)
        ax.axvline(warmup_s / 60, color="grey", linestyle="--", linewidth=1)
        ax.set_title(title)
        ax.set_xlabel("minutes")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

    panel(axes[0, 0], "resident memory, process tree", [("RSS", [s["rss_bytes"] / 2**20 for s in samples])], "MB")
    in_probe = np.array([bool(s.get("in_probe")) for s in samples])
    if in_probe.any():  # the samples the goal leaves out: a probe's working set
        rss = np.array([s["rss_bytes"] / 2**20 for s in samples])
        axes[0, 0].plot(minutes[in_probe], rss[in_probe], "x", color="red", label="inside a probe")
        axes[0, 0].legend(fontsize=8)
    step_time = [np.nan if s["step_time_s"] is None else 1e3 * s["step_time_s"] for s in samples]
    panel(axes[0, 1], "step time (median of the rows logged since the sample before)", [("step time", step_time)], "ms")
    twin = axes[0, 1].twinx()
    twin.plot(minutes, [s["load_1m"] for s in samples], color="tab:red", alpha=0.5, linewidth=1)
    twin.set_ylabel("1-minute load average (red)")
    panel(axes[0, 2], "open descriptors and threads", [("open fds", [s["open_fds"] for s in samples]),
                                                      ("threads", [s["threads"] for s in samples]),
                                                      ("processes", [s["processes"] for s in samples])], "count")
    panel(axes[1, 0], "workdir", [(k, [s[f"{k}_bytes"] / 2**20 for s in samples])
                                  for k in ("workdir", "checkpoint", "probe", "rest")], "MB")
    last = samples[-1]["appended"]
    biggest = sorted(last, key=last.get, reverse=True)[:6]
    panel(axes[1, 1], "appended files (largest six)", [(name, [s["appended"].get(name, 0) / 2**20 for s in samples])
                                                      for name in biggest], "MB")
    panel(axes[1, 2], "steps trained", [("step", [np.nan if s["step"] is None else s["step"] for s in samples])],
          "step")
    fig.suptitle("bench/long_haul.py: configs/tiny.py with evals, checkpoints, the probe, grain workers, TensorBoard, "
                 "wandb offline, plots (dashed: end of warm-up)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(out: Path, samples: list[dict], extra: dict) -> None:
    """The fit, printed, in OUT/long_haul.json beside the samples, and the plot."""
    summary = summarise(samples, extra["warmup_s"])
    summary.update(extra)
    print_summary(summary)
    numpy_scalars = lambda value: value.item()  # noqa: E731  (numpy's bools and floats, as JSON's)
    (out / "long_haul.json").write_text(json.dumps(dict(summary=summary, samples=samples), indent=1,
                                                   default=numpy_scalars))
    plot(samples, extra["warmup_s"], out / "long_haul.png")
    print(f"wrote {out / 'long_haul.json'} and {out / 'long_haul.png'}")


PROBE_START = b": fine-tuning "  # the probe's first console line; its last has " | " and the metrics


def mark_probes(samples: list[dict], log: Path) -> None:
    """Sets each sample's `in_probe`: whether the console log, as long as it was at the sample, ends inside a
    downstream probe (its last "downstream probe at step N" line is the start's, not the end's)."""
    if not log.exists():
        return
    text = log.read_bytes()
    marks = []  # (byte offset after the line, started)
    offset = 0
    for line in text.splitlines(keepends=True):
        offset += len(line)
        if b"downstream probe at step " in line:
            rest = line.split(b"downstream probe at step ", 1)[1]
            marks.append((offset, PROBE_START in rest))
    for s in samples:
        size = s["appended"].get("console.log", 0)
        before = [started for end, started in marks if end <= size]
        s["in_probe"] = bool(before and before[-1])


def main(argv) -> None:
    del argv
    if REPORT.value:
        saved = json.loads(Path(REPORT.value).read_text())
        keys = ("minutes", "warmup_s", "exit_code", "command", "cores")
        mark_probes(saved["samples"], Path(REPORT.value).parent / "run.log")
        report(Path(REPORT.value).parent, saved["samples"], {k: saved["summary"][k] for k in keys})
        return
    out = Path(OUT.value)
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    workdir, log_path = out / "run", out / "run.log"
    glue = write_sst2(out / "glue")
    warmup_s = 60 * (min(10.0, MINUTES.value / 4) if WARMUP.value < 0 else WARMUP.value)
    env = dict(os.environ, WANDB_SILENT="true", JAX_PLATFORMS="cpu")
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command(workdir, glue), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    root = psutil.Process(proc.pid)
    rows = RowReader(workdir / "metrics.jsonl")
    samples = []
    print(f"run pid {proc.pid}, log {log_path}; sampling every {SAMPLE_S.value:.0f} s for {MINUTES.value:.0f} min",
          flush=True)
    try:
        while time.time() - t0 < 60 * MINUTES.value:
            time.sleep(min(SAMPLE_S.value, max(60 * MINUTES.value - (time.time() - t0), 0.1)))
            if proc.poll() is not None:
                raise SystemExit(f"the run ended early (exit {proc.returncode}); see {log_path}")
            samples.append(sample(root, workdir, log_path, rows, t0))
            (out / "samples.jsonl").open("a").write(json.dumps(samples[-1]) + "\n")  # kept if the bench dies
            s = samples[-1]
            print(f"{s['t_s'] / 60:5.1f} min step {s['step']} | RSS {s['rss_bytes'] / 2**20:.0f} MB | fds "
                  f"{s['open_fds']} | threads {s['threads']} | procs {s['processes']} | workdir "
                  f"{s['workdir_bytes'] / 2**20:.1f} MB | step {s['step_time_s'] or 0:.3f} s | load {s['load_1m']:.1f}",
                  flush=True)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # a preemption: the run saves and exits 0
            try:
                proc.wait(timeout=300)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"the run exited {proc.returncode} after SIGTERM", flush=True)
    mark_probes(samples, log_path)
    report(out, samples, dict(minutes=MINUTES.value, warmup_s=warmup_s, exit_code=proc.returncode,
                              command=command(workdir, glue), cores=os.cpu_count()))


if __name__ == "__main__":
    app.run(main)
