"""Pre-trains a BERT-family encoder; resumes from --workdir if it holds a checkpoint.

    python -m bert_jax.pretrain --config=configs/tiny.py --workdir=/tmp/bert_tiny \
        [--config.train.learning_rate=5e-4 ...]
"""
from absl import app, flags
from ml_collections import config_flags

from bert_jax.train.log_filter import log_info_quietly
from bert_jax.train import command_line, harness
from bert_jax.train.loop import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, command_line.CONFIG_HELP, lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, tokenizer.")
flags.mark_flags_as_required(["config", "workdir"])


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_info_quietly()
    harness.setup_process(_CONFIG.value)  # before JAX starts its backend
    train_and_evaluate(_CONFIG.value, _WORKDIR.value)


def main() -> None:
    command_line.run(_main)


if __name__ == "__main__":
    main()
