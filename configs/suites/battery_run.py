"""One run of a battery as a config file: its task's fine-tuning config as OUT/battery.json records it
(bert_jax/finetune/battery.py), for a run started as a command on another host (`evaluate --executor=ray`).

    bert-jax finetune --config=configs/suites/battery_run.py:OUT,sst2 --workdir=OUT/runs/sst2/lr=2e-05/seed=0 \
        --config.seed=0 --config.init_from=runs/bert_base ...

The argument is `OUT,TASK` (OUT may be gs:// or s3://); the run's own keys come as overrides
(battery.run_overrides), as they go into the config of a run in the battery's own process.
"""
from bert_jax.finetune import battery


def get_config(arg: str):
    out, _, task = arg.rpartition(",")
    if not out or not task:
        raise ValueError(f"--config=configs/suites/battery_run.py:{arg}: give OUT,TASK (a battery's --out and task)")
    return battery.recipe(out, task)
