"""A fine-tuned run -> a Hugging Face folder that AutoModelFor{SequenceClassification, TokenClassification,
QuestionAnswering} loads, with `id2label`, giving our logits; a sentence-embedding run -> a sentence-transformers
folder. The task of the run's kind writes it (bert_jax/finetune/tasks/, renaming by bert_jax/finetune/hf_heads.py),
and OUT/README.md is its Hub model card (bert_jax/train/model_card.py, with the run's final validation metrics);
`bert-jax finetune-export` (bert_jax/commands/finetune_export.py) is the command.
"""
import json

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from bert_jax import UserError
from bert_jax.families import get_family
from bert_jax.finetune.tasks import get_task
from bert_jax.run import completion
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.train import model_card


def load_finetuned(workdir: str):
    """(model, params as numpy, config, label names) of a fine-tuning workdir: its best params if early
    stopping kept some, else its newest checkpoint's."""
    run = Workdir(workdir)
    if not run.config_json.exists():
        raise UserError(f"--workdir={workdir}: {run.config_json} does not exist; give a fine-tuning run's directory")
    config = ml_collections.ConfigDict(json.loads(run.config_json.read_text()))
    if "task" not in config:
        raise UserError(f"--workdir={workdir} is a pre-training run (its config has no task): `bert-jax export` "
                        "exports it; finetune-export takes a fine-tuning run's directory")
    names = json.loads(run.labels_json.read_text()) if run.labels_json.exists() else []
    family = get_family(config.model.family)
    task = get_task(config.task.kind)
    model = task.build_model(family, config.model, config.task, task.num_outputs(names))
    if run.best_params.exists():
        params = ocp.StandardCheckpointer().restore(paths.absolute(run.best_params))
    else:
        manager = ocp.CheckpointManager(paths.absolute(run.checkpoints),
                                        item_handlers={"state": ocp.StandardCheckpointHandler()})
        step = manager.latest_step()
        if step is None:
            raise UserError(f"--workdir={workdir}: {run.checkpoints} holds no checkpoint (the run saved none yet)")
        params = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]["params"]
        manager.close()
    return model, jax.tree.map(np.asarray, jax.device_get(params)), config, names


def hf_task_state(params: dict, config, names: list[str]) -> tuple[dict, dict]:
    """(HF state dict, config.json) of the fine-tuned model."""
    return get_task(config.task.kind).hf_state(params, config, names)


def export(workdir: str, out: str, command: str = "bert_jax.finetune.hf_export.export (a library call)") -> None:
    """Writes the fine-tuned model to `out`, its model card last; `command`: what made it, for the card."""
    _, params, config, names = load_finetuned(workdir)
    tokenizer_dir = str(Workdir(workdir).tokenizer)
    wrote = get_task(config.task.kind).export(out, params, config, names, tokenizer_dir)
    done = completion.read_done(workdir)  # the step it finished at (early stopping may end it before the last)
    model_card.write_card(workdir, out, done["step"] if done else None, command, params)
    logging.info("exported %s (%s) to %s", workdir, wrote, out)
