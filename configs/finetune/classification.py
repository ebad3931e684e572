"""Sentence (or sentence-pair) classification from a CSV with `sentence` and `label` columns.

    bert-jax finetune --config=configs/finetune/classification.py --workdir=runs/cls \
        --config.init_from=runs/tiny --config.data.train=train.csv --config.data.test=test.csv

Pairs: --config.task.text_fields=sentence1,sentence2. From a Hugging Face folder:
--config.init_from=/path/to/all-MiniLM-L6-v2. Prints accuracy, macro-F1 and Matthews
correlation at each validation (before training, then 10 times: `train.evals_per_run`), the diagnosis
of the learning curves, and writes DIR/predictions.jsonl.
"""
from bert_jax.configs.finetune import common


def get_config():
    return common.get_config("classification")
