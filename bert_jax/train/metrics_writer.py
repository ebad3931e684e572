"""Where metrics go: DIR/metrics.jsonl, TensorBoard, wandb and DIR/plots/. Process 0 only."""
import json
import os
from typing import Any

import jax

WANDB_MODES = ("disabled", "offline", "online")


def truncate_metrics(path: str, last_step: int) -> None:
    """Drops rows past `last_step`: after a resume those steps are run again and logged anew."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = [line for line in f if line.strip() and json.loads(line)["step"] <= last_step]
    with open(path, "w") as f:
        f.writelines(rows)


class MetricsWriter:
    def __init__(self, workdir: str, config, resume_step: int):
        self.active = jax.process_index() == 0
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.plots_dir = os.path.join(workdir, "plots") if config.logging.plots else None
        self.tb = self.wandb_run = None
        if not self.active:
            return
        truncate_metrics(self.path, resume_step)
        if config.logging.tensorboard:
            from tensorboardX import SummaryWriter

            self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"))
        mode = config.logging.wandb_mode
        if mode not in WANDB_MODES:
            raise ValueError(f"config.logging.wandb_mode={mode!r}; expected one of {WANDB_MODES}")
        if mode != "disabled":
            import wandb

            self.wandb_run = wandb.init(
                project=config.logging.wandb_project, name=config.logging.wandb_run_name or None,
                dir=workdir, mode=mode, config=config.to_dict(), resume="allow",
                id=config.logging.wandb_run_name or None,
            )

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.active:
            return
        row = {"step": int(step), **{k: float(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, float(v), step)
            self.tb.flush()
        if self.wandb_run is not None:
            self.wandb_run.log(dict(metrics), step=int(step))

    def plot(self) -> None:
        """Learning curves of every train/ and eval/ key, one PNG each, from metrics.jsonl."""
        if not (self.active and self.plots_dir and os.path.exists(self.path)):
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        with open(self.path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        os.makedirs(self.plots_dir, exist_ok=True)
        for name in ("loss", "mlm_accuracy"):
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
            fig.tight_layout()
            fig.savefig(os.path.join(self.plots_dir, f"{name}.png"), dpi=100)
            plt.close(fig)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
