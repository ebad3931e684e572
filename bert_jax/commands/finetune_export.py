"""Writes a fine-tuned run as a Hugging Face (or sentence-transformers) folder (bert_jax/finetune/hf_export.py), with
its Hub model card, OUT/README.md (bert_jax/train/model_card.py).

    bert-jax finetune-export --workdir=DIR --out=OUT
"""
from absl import app, flags

from bert_jax.finetune import hf_export
from bert_jax.run import command_line
from bert_jax.train.model_card import command_line as card_command


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    hf_export.export(flags.FLAGS.workdir, flags.FLAGS.out, command=card_command("finetune-export"))


def main() -> None:
    flags.DEFINE_string("workdir", None, "The fine-tuning run's directory.")
    flags.DEFINE_string("out", None, "Directory to write the Hugging Face folder to.")
    flags.mark_flags_as_required(["workdir", "out"])
    command_line.run(_main)


if __name__ == "__main__":
    main()
