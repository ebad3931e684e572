"""Prints the resolved, validated config that `--config=FILE` and its overrides give, and exits.

    bert-jax show-config --config=configs/roberta_base.py --config.data.mask_rate=0.2
    python -m bert_jax.commands.show_config --config=configs/finetune/classification.py --config.init_from=runs/tiny

Every key printed can be overridden on any command that takes the same config file
(`--config.a.b=value`). The config is checked as its run would check it before building anything:
a pre-training config by bert_jax/train/config_validation.py (for this host's devices), a
fine-tuning config (one with a `task` block) by its task kind and `init_from`. A bad key or
value ends the command with one line naming it and a non-zero exit status.
"""
import sys

from absl import app, flags
from ml_collections import config_flags

from bert_jax.finetune.run import validate_config as validate_finetune_config
from bert_jax.run import command_line
from bert_jax.train.config_validation import resolve_config, validate_config

_CONFIG = config_flags.DEFINE_config_file("config", None, command_line.CONFIG_HELP, lock_config=True)
flags.mark_flags_as_required(["config"])


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    config = _CONFIG.value.copy_and_resolve_references()
    try:
        if "task" not in config:
            config = resolve_config(config)  # `auto` keys printed as the numbers a run uses
        (validate_finetune_config if "task" in config else validate_config)(config)
    except ValueError as error:
        sys.exit(f"show-config: {error}")
    print(config)


def main() -> None:
    command_line.run(_main)


if __name__ == "__main__":
    main()
