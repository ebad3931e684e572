"""Exports a pre-training workdir's params: a Hugging Face folder (default) or a params-only orbax checkpoint.

    bert-jax export --workdir=runs/tiny --out=/tmp/bert_tiny_hf [--step=N] [--ema] [--format=hf|params]

`--format=hf` writes config.json, model.safetensors and the tokenizer files, which
`transformers.AutoModelForMaskedLM.from_pretrained(OUT)` and `AutoTokenizer` load;
`--format=params` writes OUT/params (orbax, params only) and OUT/config.json, for JAX users.
`--ema` exports the step's EMA of the params (a run trained with `config.train.ema_decay` > 0; what
`DIR:STEP:ema` names to fine-tuning and `evaluate`) instead of the params themselves. Either way OUT/README.md is
the Hub model card (bert_jax/train/model_card.py): family, data, steps, tokens, lineage, final eval, this command.
"""
from absl import app, flags, logging

from bert_jax.run import command_line
from bert_jax.train.export import FORMATS, export
from bert_jax.train.model_card import command_line as card_command
from bert_jax.run.log_filter import log_info_quietly


def _define_flags():
    flags.DEFINE_string("workdir", None, "The pre-training run's directory (config.json, checkpoints/, tokenizer/).")
    flags.DEFINE_string("out", None, "Directory to write the export to.")
    flags.DEFINE_integer("step", None, "Checkpoint step to export; default: the newest.")
    flags.DEFINE_bool("ema", False, "Export the checkpoint's EMA weights (config.train.ema_decay) instead of its "
                                    "params.")
    flags.DEFINE_enum("format", "hf", list(FORMATS), "hf: Hugging Face folder; params: params-only orbax checkpoint.")
    flags.mark_flags_as_required(["workdir", "out"])


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_info_quietly()
    flag_values = flags.FLAGS
    step = export(flag_values.workdir, flag_values.out, flag_values.step, flag_values.format, ema=flag_values.ema,
                  command=card_command("export"))
    logging.info("exported step %d%s of %s to %s (%s)", step, " (EMA)" if flag_values.ema else "", flag_values.workdir,
                 flag_values.out, flag_values.format)


def main() -> None:
    # Flags are defined here, not at import, so importing this module never clashes with other entry points'.
    _define_flags()
    command_line.run(_main)


if __name__ == "__main__":
    main()
