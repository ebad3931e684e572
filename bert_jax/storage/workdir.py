"""A run's directory as a value: every file and folder a pre-training or fine-tuning run keeps there.

The names are the contract of docs/design.md's workdir table (config.json, checkpoints/,
metrics.jsonl, tokenizer/, plots/, DONE) plus what fine-tuning adds; they are spelled here
once, so the train loop, export, the distillation teacher, `init_from` and the launchers
agree on them. The root may be local or a gs:// / s3:// URL (every sub-path is an
`epath.Path` from the path layer).

Reading a run's config back lives here, so that whoever reads a workdir imports this module
and not an entry point. Its params are read by `bert_jax.checkpoint.params.restore_params`: that
needs the model zoo, which the path layer (launchers, leases) must not load.
"""
from __future__ import annotations

import dataclasses
import json
import os

import ml_collections
import orbax.checkpoint as ocp
from etils import epath

from bert_jax import UserError
from bert_jax.storage import paths

CONFIG_FILE = "config.json"
CONFIG_HISTORY_FILE = "config_history.jsonl"  # the first config and every change a resume made
WANDB_ID_FILE = "wandb_id"  # the run's Weights & Biases id, derived once (train/metrics_writer.py)
CHECKPOINTS_DIR = "checkpoints"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
TOKENIZER_DIR = "tokenizer"
PLOTS_DIR = "plots"
DONE_FILE = "DONE"
LEASE_FILE = "LEASE"  # the live run's hold on the workdir (train/lease.py)
GOODPUT_DIR = "goodput"  # one record per start of the run (run/goodput.py)
PROFILE_DIR = "profile"  # XProf traces of config.train.profile's steps (run/profile_window.py)
SPIKE_WINDOWS_FILE = "spike_windows.json"  # config.train.spike's window of step losses per checkpoint (run/spike.py)
# Fine-tuning adds these.
LABELS_FILE = "labels.json"
BEST_DIR = "best"
BEST_FILE = "best.json"
PREDICTIONS_FILE = "predictions.jsonl"
RESULTS_FILE = "results.json"
DIAGNOSIS_FILE = "diagnosis.json"
SEEDS_FILE = "seeds.json"


def _tuples(value):
    """JSON turns the config's tuples (mesh shape, axis rules) into lists; the code expects tuples."""
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def config_from_json(text: str) -> ml_collections.ConfigDict:
    """A config from ml_collections' `to_json_best_effort` output (a run's config.json, a battery's recipe)."""
    return ml_collections.ConfigDict(_tuples(json.loads(text)))


@dataclasses.dataclass(frozen=True)
class Workdir:
    """`Workdir("runs/tiny")`, `Workdir("gs://bucket/run")`: the root and its typed sub-paths."""

    root: epath.Path

    def __init__(self, root: str | os.PathLike):
        object.__setattr__(self, "root", paths.path(root))

    def __str__(self) -> str:
        return str(self.root)

    # What a pre-training run writes (docs/design.md, "Workdir").
    @property
    def config_json(self) -> epath.Path:
        return self.root / CONFIG_FILE

    @property
    def config_history(self) -> epath.Path:
        return self.root / CONFIG_HISTORY_FILE

    @property
    def wandb_id(self) -> epath.Path:
        return self.root / WANDB_ID_FILE

    @property
    def checkpoints(self) -> epath.Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def metrics_jsonl(self) -> epath.Path:
        return self.root / METRICS_FILE

    @property
    def tensorboard(self) -> epath.Path:
        return self.root / TENSORBOARD_DIR

    @property
    def tokenizer(self) -> epath.Path:
        return self.root / TOKENIZER_DIR

    @property
    def plots(self) -> epath.Path:
        return self.root / PLOTS_DIR

    @property
    def done(self) -> epath.Path:
        return self.root / DONE_FILE

    @property
    def lease(self) -> epath.Path:
        return self.root / LEASE_FILE

    @property
    def goodput(self) -> epath.Path:
        return self.root / GOODPUT_DIR

    @property
    def profile(self) -> epath.Path:
        return self.root / PROFILE_DIR

    @property
    def spike_windows(self) -> epath.Path:
        return self.root / SPIKE_WINDOWS_FILE

    # What a fine-tuning run adds.
    @property
    def labels_json(self) -> epath.Path:
        return self.root / LABELS_FILE

    @property
    def best(self) -> epath.Path:
        return self.root / BEST_DIR

    @property
    def best_params(self) -> epath.Path:
        """The best params by config.early_stopping.metric (a params-only orbax checkpoint)."""
        return self.best / "params"

    @property
    def best_json(self) -> epath.Path:
        return self.root / BEST_FILE

    @property
    def predictions_jsonl(self) -> epath.Path:
        return self.root / PREDICTIONS_FILE

    @property
    def results_json(self) -> epath.Path:
        return self.root / RESULTS_FILE

    @property
    def diagnosis_json(self) -> epath.Path:
        return self.root / DIAGNOSIS_FILE

    @property
    def seeds_json(self) -> epath.Path:
        """Mean and spread over the seeds of a `config.seeds` run, whose runs are `seed(s)`."""
        return self.root / SEEDS_FILE

    def seed(self, seed: int) -> Workdir:
        return Workdir(self.root / f"seed_{seed}")

    # Reading a run back.
    def holds_a_run(self) -> bool:
        """Holds a run's config.json and checkpoints/ (as opposed to, say, a Hugging Face folder)."""
        return self.config_json.exists() and self.checkpoints.is_dir()

    def config(self) -> ml_collections.ConfigDict:
        """The run's config, rebuilt from config.json (ml_collections' `to_json_best_effort` output)."""
        if not self.config_json.exists():
            raise UserError(f"{self.config_json} does not exist: {self.root} is not a run's directory")
        return config_from_json(self.config_json.read_text())

    def checkpoint_steps(self) -> list[int]:
        """The committed checkpoints' steps, ascending (orbax skips unfinished saves); [] if none."""
        if not paths.fresh(self.checkpoints).is_dir():  # (other processes write them)
            return []
        return sorted(ocp.utils.checkpoint_steps(paths.absolute(self.checkpoints)))
