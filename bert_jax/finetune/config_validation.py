"""The one check of a fine-tuning config (one with a `task` block), where a command starts, before anything exists.

`check_config` is what `finetune` runs before it creates the workdir and what `bert-jax show-config` prints, so
show-config exits 0 exactly when the run would start: the task kind and its keys, the seeds, the data format and
files, and the encoder `config.init_from` names (its weights are read only by the run). A refusal is a
`bert_jax.UserError` naming the key.
"""
import json

from bert_jax.checkpoint import reference
from bert_jax.finetune import data, init_from
from bert_jax.finetune import parametrization as finetune_mup
from bert_jax.finetune.tasks import get_task
from bert_jax.run import profile_window
from bert_jax.run.refusal import reraise
from bert_jax.storage import paths, preflight
from bert_jax.storage.workdir import Workdir

SPLITS = ("train", "validation", "test")


def check_config(config):
    """`config`, checked as its run would check it (a copy: the caller's stays as given)."""
    config = config.copy_and_resolve_references()
    try:
        task = get_task(config.task.kind)
        task.validate(config.task)
        _check_packing(config.data, task)
        seeds(config)
        finetune_mup.check_choice(config.train)  # the value itself, whatever the source
        profile_window.check(config.train.profile, None)  # its end is checked by the run, whose length epochs set
        source = reference.split(config.init_from)[0]
        if source and paths.is_remote(source):
            preflight.check_readable(source, "config.init_from")
        init_from.check(config.init_from)
        finetune_mup.check(config.train, _source_model_config(config.init_from), config.init_from)
        _check_data(config.data)
    except (ValueError, FileNotFoundError) as error:  # a check's refusal is the user's; a fault keeps its traceback
        reraise(error)
    return config


def _source_model_config(init_from_: str) -> dict | None:
    """The `model` block of the run config.init_from names (a pre-training or fine-tuning workdir's config.json),
    weights unread; None for a Hugging Face folder (its config.json is transformers', standard: an export folds μP)."""
    config_json = Workdir(reference.split(init_from_)[0]).config_json
    model = json.loads(config_json.read_text()).get("model") if config_json.exists() else None
    return model if isinstance(model, dict) else None


def seeds(config) -> list[int]:
    """config.seeds ("0,1,2") as numbers; [] for one run of config.seed."""
    try:
        return [int(s) for s in str(config.seeds).split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"config.seeds={config.seeds!r} is not a comma-separated list of integers") from None


def _check_packing(data_cfg, task) -> None:
    if data_cfg.packing and not task.packs:
        raise ValueError(f"config.data.packing=True, but {task.name} examples already fill "
                         f"config.data.max_seq_length; set --config.data.packing=False")
    if data_cfg.pack_rows_multiple < 1:
        raise ValueError(f"config.data.pack_rows_multiple={data_cfg.pack_rows_multiple} must be >= 1")


def _check_data(data_cfg) -> None:
    """The format is known and the files its splits name exist (a tfds split is a name, read by the run)."""
    if data_cfg.format not in data.FORMATS:
        raise ValueError(f"config.data.format={data_cfg.format!r} is not one of {data.FORMATS}")
    if not data_cfg.train:
        raise ValueError("config.data.train names no file: set --config.data.train=PATH")
    if data_cfg.format == "tfds":
        return
    for split in SPLITS:
        path = data_cfg[split]
        if path and paths.is_remote(path):
            preflight.check_readable(path, f"config.data.{split}")
        elif path and not paths.path(path).exists():
            raise ValueError(f"config.data.{split}={path!r} does not exist")
