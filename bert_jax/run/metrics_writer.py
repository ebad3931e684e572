"""Where metrics go: DIR/metrics.jsonl, TensorBoard, wandb and DIR/plots/ (learning curves, and step_time.png: the
time/* split of each logged step). Process 0 only.

DIR may be a bucket, which has no append and no rename. The choice: metrics.jsonl and the
TensorBoard events are written to a local staging folder (the workdir itself when it is
local) and uploaded whole, each as one object, by `sync()`, which the loop calls after
every checkpoint save and at the end. An upload is atomic, so after a kill the bucket
holds the rows up to the last checkpoint, which are the steps a resume does not re-run;
the re-run steps are logged again. Plots are rewritten whole at each eval.

wandb: one run per workdir. Its id is derived once from the workdir (`wandb_run_id`) and kept in
DIR/wandb_id, and wandb.init resumes it, so every resume, relaunch and preemption of the run logs
into the same wandb run; `logging.wandb_run_name` names it (default: the workdir's name) and
`logging.wandb_group` groups it (a sweep sets both: group = the sweep, name = the point); a branch
without one is grouped with its root run (`wandb_init_args`). Its x axis is the `step` metric (STEP), not wandb's own
step, which only grows: wandb ignores a row logged at a step below its newest, so the steps a rollback or a resume
trains again would be lost there.

A rollback (bert_jax/run/spike.py) drops metrics.jsonl's rows after the restored step; TensorBoard's events and
wandb's history cannot drop a row, so they keep the rolled-back rows, get a marker where those end
(ROLLED_BACK_TO: the step rolled back to, at the last step logged before the rollback), then the rows trained again.
"""
import hashlib
import io
import json
import re
import tempfile
from typing import Any

import jax
from absl import logging

from bert_jax.run import lineage
from bert_jax.storage import paths
from bert_jax.storage.workdir import METRICS_FILE, TENSORBOARD_DIR, Workdir
from bert_jax.run.metrics_file import as_text, read_rows, truncate_metrics
from bert_jax.run.step_clock import ROW_ACTIVITIES

WANDB_MODES = ("disabled", "offline", "online")
STEP = "step"  # wandb's x axis: a metric, so rows may go back to an earlier step
ROLLED_BACK_TO = "train/rolled_back_to"  # TensorBoard's and wandb's marker of a rollback (rewind)


def wandb_run_id(workdir: str) -> str:
    """The workdir's wandb run id: read from DIR/wandb_id, else derived from the workdir's absolute path
    ("<name>-<12 hex digits of its sha256>", the characters wandb allows) and written there."""
    stored = Workdir(workdir).wandb_id
    if stored.exists():
        return stored.read_text().strip()
    root = str(paths.absolute(workdir)).rstrip("/")
    name = re.sub(r"[^A-Za-z0-9_-]", "_", root.rsplit("/", 1)[-1])[:48] or "run"
    run_id = f"{name}-{hashlib.sha256(root.encode()).hexdigest()[:12]}"
    paths.write_atomically(stored, run_id + "\n")
    return run_id


def wandb_init_args(config, workdir: str, staging: str) -> dict:
    """wandb.init's arguments. The group: `logging.wandb_group` when set (a sweep's), else a branch's root run's
    name (bert_jax/run/lineage.py), so a run and its branches are seen together; else none."""
    return dict(project=config.logging.wandb_project, id=wandb_run_id(workdir), resume="allow",
                name=config.logging.wandb_run_name or paths.path(workdir).name,
                group=config.logging.wandb_group or lineage.wandb_group(workdir), dir=staging,
                mode=config.logging.wandb_mode, config=config.to_dict())


class MetricsWriter:
    def __init__(self, workdir: str, config, resume_step: int):
        self.active = jax.process_index() == 0
        self.workdir = paths.path(workdir)
        self.remote = paths.is_remote(workdir)
        self.plots_dir = Workdir(workdir).plots if config.logging.plots else None
        self.tb = self.wandb_run = None
        self.last_step = None  # the newest row's step: where a rollback's marker goes
        if not self.active:
            return
        rows = truncate_metrics(self.workdir / METRICS_FILE, resume_step)
        # Local staging for a bucket workdir: appends and TensorBoard's event files need a file system.
        self.staging = paths.path(tempfile.mkdtemp(prefix="bert_jax_metrics_")) if self.remote else self.workdir
        self.path = self.staging / METRICS_FILE
        if self.remote:
            self.path.write_text(as_text(rows))
            logging.info("metrics and TensorBoard events are staged in %s and uploaded to %s at each checkpoint",
                         self.staging, workdir)
        if config.logging.tensorboard:
            from tensorboardX import SummaryWriter  # loads protobuf: only config.logging.tensorboard needs it

            self.tb = SummaryWriter(str(self.staging / TENSORBOARD_DIR))
        mode = config.logging.wandb_mode
        if mode not in WANDB_MODES:
            raise ValueError(f"config.logging.wandb_mode={mode!r}; expected one of {WANDB_MODES}")
        if mode != "disabled":
            import wandb  # seconds to load: only a wandb_mode other than disabled needs it

            self.wandb_run = wandb.init(**wandb_init_args(config, workdir, str(self.staging)))
            self.wandb_run.define_metric(STEP)
            self.wandb_run.define_metric("*", step_metric=STEP)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.active:
            return
        self.last_step = int(step)
        row = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:  # the local file (staging for a bucket)
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, float(v), step)
            self.tb.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({STEP: int(step), **metrics})

    def rewind(self, step: int) -> None:
        """Drops metrics.jsonl's rows after `step`, which a rollback trains again (bert_jax/run/spike.py). TensorBoard
        and wandb cannot drop theirs: they get ROLLED_BACK_TO = `step` at the last step logged, so a reader sees where
        the rows that follow go back to."""
        if not self.active:
            return
        truncate_metrics(self.path, step)
        if self.last_step is None:
            return
        if self.tb is not None:
            self.tb.add_scalar(ROLLED_BACK_TO, float(step), self.last_step)
            self.tb.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({STEP: self.last_step, ROLLED_BACK_TO: float(step)})

    def sync(self) -> None:
        """Uploads metrics.jsonl and the TensorBoard event files, each whole, to a bucket workdir."""
        if not (self.active and self.remote):
            return
        paths.copy_file(self.path, self.workdir / METRICS_FILE)
        local_tb = self.staging / TENSORBOARD_DIR
        if self.tb is not None and local_tb.exists():
            self.tb.flush()
            for events in local_tb.iterdir():
                paths.copy_file(events, self.workdir / TENSORBOARD_DIR / events.name)

    def plot(self, names: tuple[str, ...] = ("loss", "mlm_accuracy")) -> None:
        """Learning curves of the named metrics, train and eval, one PNG each, from metrics.jsonl."""
        if not (self.active and self.plots_dir and self.path.exists()):
            return
        # matplotlib costs about half a second to load, and only plots need it.
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # after use("Agg"), so no display is needed

        rows = read_rows(self.path)
        for name in names:
            fig, ax = plt.subplots(figsize=(6, 4))
            for split in ("train", "eval"):
                key = f"{split}/{name}"
                points = [(r["step"], r[key]) for r in rows if key in r]
                if points:
                    ax.plot(*zip(*points), label=key, marker="o" if split == "eval" else None)
            ax.set_xlabel("step")
            ax.set_ylabel(name)
            ax.legend()
            ax.grid(alpha=0.3)
            self._save(fig, f"{name}.png")
        self._plot_step_time(rows)

    def _plot_step_time(self, rows: list[dict]) -> None:
        """plots/step_time.png: where each logged step's time went (the time/* keys, stacked), under the measured
        step time (perf/step_time_s) where the run logs it."""
        import matplotlib.pyplot as plt  # noqa: PLC0415  (plot() chose the backend)

        keys = [f"time/{name}_s" for name in ROW_ACTIVITIES]
        rows = [r for r in rows if all(k in r for k in keys)]
        if not rows:
            return
        steps = [r["step"] for r in rows]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.stackplot(steps, *[[r[k] for r in rows] for k in keys], labels=keys, alpha=0.8)
        measured = [(r["step"], r["perf/step_time_s"]) for r in rows if "perf/step_time_s" in r]
        if measured:
            ax.plot(*zip(*measured), color="black", linewidth=1, label="perf/step_time_s")
        ax.set_xlabel("step")
        ax.set_ylabel("seconds per step")
        ax.set_title("where each step's time went")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        self._save(fig, "step_time.png")

    def _save(self, fig, name: str) -> None:
        import matplotlib.pyplot as plt  # noqa: PLC0415

        fig.tight_layout()
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=100)
        plt.close(fig)
        paths.write_atomically(self.plots_dir / name, png.getvalue())

    def close(self) -> None:
        self.sync()
        if self.tb is not None:
            self.tb.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
        if self.active and self.remote:
            self.staging.rmtree()
