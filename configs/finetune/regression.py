"""Sentence-pair regression (STS-B style) from a CSV with `sentence1`, `sentence2` and a numeric `score`.

    bert-jax finetune --config=configs/finetune/regression.py --workdir=runs/sts \
        --config.init_from=runs/tiny --config.data.train=sts_train.csv --config.data.validation=sts_dev.csv

Prints Pearson and Spearman correlations at each validation (before training, then 10 times:
`train.evals_per_run`).
"""
from bert_jax.configs.finetune import common


def get_config():
    c = common.get_config("regression")
    c.task.text_fields = "sentence1,sentence2"
    c.task.label_field = "score"
    c.early_stopping.metric = ""
    return c
