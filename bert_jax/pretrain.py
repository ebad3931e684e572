"""Pre-trains a BERT-family encoder; resumes from --workdir if it holds a checkpoint.

    python -m bert_jax.pretrain --config=configs/tiny.py --workdir=/tmp/bert_tiny \
        [--config.train.learning_rate=5e-4 ...]
"""
import logging as py_logging

from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax.train.loop import train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, tokenizer.")
flags.mark_flags_as_required(["config", "workdir"])


class _QuietLibraries(py_logging.Filter):
    """Keeps orbax's and grain's per-save INFO chatter out of the progress log; their warnings still show."""

    def filter(self, record: py_logging.LogRecord) -> bool:
        noisy = any(f"/{lib}/" in record.pathname for lib in ("orbax", "grain", "jax/_src"))
        return record.levelno >= py_logging.WARNING or not noisy


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.INFO)
    logging.get_absl_handler().addFilter(_QuietLibraries())
    train_and_evaluate(_CONFIG.value, _WORKDIR.value)


def main() -> None:
    app.run(_main)


if __name__ == "__main__":
    main()
