"""Prints the resolved, validated config that `--config=FILE` and its overrides give, and exits.

    bert-jax show-config --config=configs/roberta_base.py --config.data.mask_rate=0.2
    bert-jax show-config --config=configs/finetune/classification.py --config.init_from=runs/tiny

Every key printed can be overridden on any command that takes the same config file
(`--config.a.b=value`). What is printed is what the run's own check returns, the check `pretrain` and
`finetune` run before they create anything: bert_jax/train/config_validation.py for a pre-training config,
bert_jax/finetune/config_validation.py for a fine-tuning one (one with a `task` block). Each later stage of
`config.train.stages` (and of `train.batch_size_warmup` and `data.mask_rate_schedule`, stage 0 too when they
change it from step 0) follows as the keys it trains with differently. The command exits 0 exactly when the run
would start; a bad key, value or path ends it with one line naming it and exit status 2.
"""
from absl import app, flags, logging
from ml_collections import config_flags

from bert_jax.finetune import config_validation as finetune_config
from bert_jax.run import command_line
from bert_jax.train import config_validation as pretrain_config
from bert_jax.train import stages

_CONFIG = config_flags.DEFINE_config_file("config", None, command_line.CONFIG_HELP, lock_config=True)
flags.mark_flags_as_required(["config"])


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)  # what resolves (`auto -> N`) is printed in the config itself
    config = _CONFIG.value
    if "task" in config:  # a fine-tuning config
        print(finetune_config.check_config(config))
        return
    config = pretrain_config.check_config(config)
    print(config)
    before = config  # stage 0 trains the config as written, unless a ramp or schedule changes it from step 0
    for stage in stages.plan(config):
        changed = _changed(before, stage.config)
        if stage.index or changed:
            print(f"# stage {stage.index}, steps {stage.start + 1} to {stage.end}:")
            print("\n".join(f"{key}: {value}" for key, value in changed.items()))
        before = stage.config


def _changed(before, after) -> dict:
    """{config path: value} of `after`'s keys whose value differs from `before`'s."""
    old, new = stages.flat(before), stages.flat(after)
    return {key: value for key, value in new.items() if old.get(key) != value}


def main() -> None:
    command_line.run(_main)


if __name__ == "__main__":
    main()
