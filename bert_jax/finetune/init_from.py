"""Where the encoder comes from: a pre-training workdir (`DIR`, `DIR:STEP`, `DIR:STEP:ema` or `DIR:ema` for its EMA
weights; bert_jax/checkpoint/reference.py parses them), a Hugging Face folder, or a
finished fine-tuning run (its encoder: intermediate-task transfer, as RTE, MRPC and STS-B start from MNLI's run
in RoBERTa's and ELECTRA's GLUE recipe).

Either way the result is the family, its `config.model`, the tokenizer folder and the
pre-trained parameters (the family module's tree, or a fine-tuned run's backbone); the task model takes
the subtree its `encode` uses. The family of an HF folder is the registered one whose
`HfConverter.model_type` its config.json names: nothing here knows a family by name.
"""
import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from bert_jax import UserError
from bert_jax.hf import folder as hf_folder
from bert_jax.checkpoint import reference
from bert_jax.checkpoint.params import check_ema, restore_params
from bert_jax.families import Family, family_of_hf_config, get_family, model_for
from bert_jax.models.probe import abstract_params
from bert_jax.models.scan_layout import stack_layers, unstack_layers
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.run import completion
from bert_jax.train import stages

# config.model keys a fine-tuning config sets whatever the source says: how to run, not what was trained.
RUNTIME_KEYS = ("dtype", "param_dtype", "scan_layers", "scan_unroll", "unroll_on_gpu", "remat_policy", "attention_impl", "splash_interpret",
                "dropout_rate", "attention_dropout_rate")


@dataclasses.dataclass
class Source:
    kind: str  # "workdir" | "hf" | "finetuned" | "pretraining" (the downstream probe's current params)
    path: str
    step: int | None
    family: Family
    model_cfg: ml_collections.ConfigDict
    tokenizer_dir: str
    params: dict  # the family module's parameters (numpy), laid out as model_cfg.scan_layers says


def zeros_like_family_params(family: Family, model_cfg) -> dict:
    """The family module's full parameter tree (pre-training heads included), as zeros: a fallback for
    tensors a source lacks, and the frame the family's hf_export fills."""
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), abstract_params(family.build_model(model_cfg)))


def _with_runtime(model_cfg: dict, runtime) -> ml_collections.ConfigDict:
    out = ml_collections.ConfigDict(dict(model_cfg))
    for key in RUNTIME_KEYS:
        if key in runtime:
            out[key] = runtime[key]
    return out


def _relayout(params: dict, scan_layers: bool) -> dict:
    params = unstack_layers(params)
    return stack_layers(params) if scan_layers else params


EMPTY = ("config.init_from is empty: name a pre-training workdir (DIR, DIR:STEP or DIR:STEP:ema), a Hugging Face model "
         "folder or a finished fine-tuning run")


def check(init_from: str, key: str = "config.init_from") -> Callable[[Any], Source]:
    """What reads the encoder `config.init_from` names ((runtime model config) -> Source), checked without reading
    any weights (a fine-tuning config's check, bert_jax/finetune/config_validation.py); UserError naming `key`
    (`--from` for inspect)."""
    if not init_from:
        raise UserError(EMPTY.replace("config.init_from", key, 1))
    path, step, ema = reference.split(init_from)
    root, run = paths.path(path), Workdir(path)
    if run.config_json.exists() and "task" in json.loads(run.config_json.read_text()):  # a fine-tuning run's
        if step is not None or ema:
            raise UserError(f"{key}={init_from!r}: a fine-tuning run is read at its end, not at a step or its EMA")
        if completion.read_done(run.root) is None:
            raise UserError(f"{key}={init_from!r} is a fine-tuning run that has not finished (no DONE)")
        return functools.partial(_finetuned, run)
    if run.holds_a_run():
        ref = reference.resolve(init_from, key)  # the step there (STEP, or the newest), or names the steps that are
        if ref.ema:
            check_ema(ref.run, ref.step)
        return functools.partial(_pretraining_run, ref.workdir, ref.step, ref.ema)
    weights = any((root / name).exists() for name in (hf_folder.SAFETENSORS_FILE, hf_folder.TORCH_FILE))
    if (root / "config.json").exists() and weights:  # a Hugging Face folder's config.json
        if step is not None or ema:
            raise UserError(f"{key}={init_from!r}: a Hugging Face folder has no steps and no EMA")
        return functools.partial(_hf_folder, path)
    raise UserError(f"{key}={init_from!r} is neither a pre-training workdir (config.json and "
                    f"checkpoints/) nor a Hugging Face model folder (config.json and model.safetensors)")


def resolve(init_from: str, runtime_model_cfg, key: str = "config.init_from") -> Source:
    """The encoder `config.init_from` names, its weights read."""
    return check(init_from, key)(runtime_model_cfg)


def _pretraining_run(path: str, step: int, ema: bool, runtime_model_cfg) -> Source:
    run = Workdir(path)
    params, step = restore_params(run, model_for, step, ema=ema)
    # The model as the stage that trained `step` runs it: a biphasic run's masked phase attends both ways.
    model_cfg = _with_runtime(stages.stage_at(run.config(), step).config.model.to_dict(), runtime_model_cfg)
    return Source("workdir", path, step, get_family(model_cfg.family), model_cfg, str(run.tokenizer),
                  _relayout(params, model_cfg.scan_layers))


def _hf_folder(path: str, runtime_model_cfg) -> Source:
    hf_cfg = hf_folder.read_hf_config(path)
    family = family_of_hf_config(hf_cfg, path)
    values = dict(family.hf.model_config(hf_cfg), family=family.name,
                  initializer_range=hf_cfg.get("initializer_range", 0.02))
    model_cfg = _with_runtime(values, runtime_model_cfg)
    fallback = zeros_like_family_params(family, model_cfg)
    params, _ = family.hf.from_hf(hf_folder.read_hf_state(path), hf_cfg, model_cfg, fallback)
    return Source("hf", path, None, family, model_cfg, path, params)


def _finetuned(run: Workdir, runtime_model_cfg) -> Source:
    """The encoder of a finished fine-tuning run: its best params if it kept some, else its last step's backbone;
    its config.json's `model` is its own source's (bert_jax/finetune/run.py writes it)."""
    model_cfg = _with_runtime(run.config().model.to_dict(), runtime_model_cfg)
    if run.best_params.exists():
        params = ocp.StandardCheckpointer().restore(paths.absolute(run.best_params))
    else:
        manager = ocp.CheckpointManager(paths.absolute(run.checkpoints),
                                        item_handlers={"state": ocp.StandardCheckpointHandler()})
        restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore()))
        params = restored["state"]["params"]
        manager.close()
    backbone = jax.tree.map(np.asarray, jax.device_get(params["backbone"]))
    return Source("finetuned", str(run), None, get_family(model_cfg.family), model_cfg, str(run.tokenizer),
                  _relayout(backbone, model_cfg.scan_layers))


def backbone_subset(pretrained: dict, fresh: dict, where: str = "params/backbone") -> dict:
    """The leaves of `pretrained` at the paths of `fresh` (the task model's backbone tree), shape-checked."""
    out = {}
    for key, value in fresh.items():
        if key not in pretrained:
            raise ValueError(f"{where}/{key} is not in the pre-trained parameters")
        if isinstance(value, dict):
            out[key] = backbone_subset(pretrained[key], value, f"{where}/{key}")
        else:
            have = np.asarray(pretrained[key])
            if have.shape != tuple(value.shape):
                raise ValueError(f"{where}/{key} is {have.shape} in the pre-trained parameters, "
                                 f"{tuple(value.shape)} in the model")
            out[key] = have.astype(value.dtype)
    return out
