"""Fine-tunes from a pre-training run or a Hugging Face folder (bert_jax/finetune/run.py).

    `bert-jax finetune --config=configs/finetune/X.py --workdir=DIR` (see bert_jax/finetune/run.py).
"""
from absl import app, flags
from ml_collections import config_flags

from bert_jax.run import command_line
from bert_jax.run.log_filter import log_info_quietly


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_info_quietly()
    # Loaded once the flags parsed: --help and a bad flag answer without loading JAX and the fine-tuning code.
    from bert_jax.finetune.run import finetune
    from bert_jax.run import process_setup  # as finetune above

    process_setup.setup_process(flags.FLAGS.config)  # before JAX starts its backend
    # Its first act is the one check of the config (bert_jax/finetune/config_validation.py, what show-config prints),
    # before anything is created.
    finetune(flags.FLAGS.config, flags.FLAGS.workdir)


def main() -> None:
    config_flags.DEFINE_config_file("config", None, f"A configs/finetune/*.py file: {command_line.CONFIG_HELP}",
                                    lock_config=True)
    flags.DEFINE_string("workdir", None, "Directory of the run (checkpoints, metrics, predictions).")
    flags.mark_flags_as_required(["config", "workdir"])
    command_line.run(_main)


if __name__ == "__main__":
    main()
