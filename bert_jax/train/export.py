"""A pre-training run's params, exported: a Hugging Face folder (default) or a params-only orbax checkpoint.

The work of `python -m bert_jax.commands.export` (bert_jax/commands/export.py), here so that library code that needs an
export (vocabulary extension) does not import a command. Every export gets OUT/README.md, the Hub model card
(bert_jax/train/model_card.py).
"""
import orbax.checkpoint as ocp

from bert_jax.checkpoint.params import restore_params
from bert_jax.families import get_family, model_for
from bert_jax.storage import paths
from bert_jax.storage.workdir import CONFIG_FILE, Workdir
from bert_jax.train import model_card, stages

FORMATS = ("hf", "params")


def export(workdir: str, out: str, step: int | None = None, fmt: str = "hf", ema: bool = False,
           command: str = "bert_jax.train.export.export (a library call)") -> int:
    """Writes the export to `out`, its model card last; returns the step exported. `ema`: the step's EMA weights
    (config.train.ema_decay) in place of its params, written the same way: a reader of the export cannot tell them
    apart. `command`: what made it, for the card."""
    if fmt not in FORMATS:
        raise ValueError(f"--format={fmt!r}; expected one of {FORMATS}")
    run = Workdir(workdir)
    config = run.config()
    params, step = restore_params(run, model_for, step, ema=ema)
    if fmt == "params":
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(paths.absolute(paths.path(out) / "params"), params, force=True)
        checkpointer.wait_until_finished()
        paths.copy_file(run.config_json, paths.path(out) / CONFIG_FILE)
        model_card.write_card(workdir, out, step, command, params)
        return step
    family = get_family(config.model.family)
    if family.hf is None:
        raise ValueError(f"config.model.family={family.name!r} has no Hugging Face export; use --format=params")
    tokenizer = str(run.tokenizer) if run.tokenizer.is_dir() else None
    # The main folder and any beside it (ELECTRA's generator, as OUT/generator), as the stage that trained `step` has
    # it: its objective picks the class (a biphasic run's causal phase exports a decoder, its masked one an encoder).
    model_cfg = stages.stage_at(config, step).config.model
    family.to_hf(params, model_cfg).write(out, tokenizer, model_max_length=config.data.max_seq_length)
    model_card.write_card(workdir, out, step, command, params)
    return step
