r"""Pre-trains a BERT-family encoder; resumes from --workdir if it holds a checkpoint.

    bert-jax pretrain --config=configs/tiny.py --workdir=/tmp/bert_tiny \
        [--config.train.learning_rate=5e-4 ...]

With --config.eval.downstream_suite=smoke --config.eval.downstream_data_dir=GLUE_DIR, eval steps also fine-tune
that suite from the current params and log downstream/<task>/<metric> (bert_jax/finetune/downstream_probe.py).
"""
import jax
from absl import app, flags
from ml_collections import config_flags

from bert_jax.finetune.downstream_probe import DownstreamProbe
from bert_jax.run.log_filter import log_info_quietly
from bert_jax.run import command_line, process_setup
from bert_jax.train.config_validation import check_config
from bert_jax.train.loop import train
from bert_jax.configs.suites import load_suite

_CONFIG = config_flags.DEFINE_config_file("config", None, command_line.CONFIG_HELP, lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, tokenizer.")
flags.mark_flags_as_required(["config", "workdir"])


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    log_info_quietly()
    process_setup.setup_process(_CONFIG.value)  # before JAX starts its backend
    # The one check (the one show-config prints), before anything is created: the workdir, the probe's data.
    config = check_config(_CONFIG.value, _WORKDIR.value, jax.process_count())
    train(config, _WORKDIR.value, downstream=downstream_probe(config, _WORKDIR.value))


def downstream_probe(config, workdir: str):
    """The probe config.eval.downstream_suite asks for (bert_jax/finetune/downstream_probe.py), its suite read and
    checked now, before the run compiles; None without one."""
    if not config.eval.downstream_suite:
        return None
    suite = load_suite(config.eval.downstream_suite)
    return DownstreamProbe(config, workdir, suite)


def main() -> None:
    command_line.run(_main)


if __name__ == "__main__":
    main()
