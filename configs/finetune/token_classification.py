"""Named-entity recognition (BIO tags) from CoNLL files: a word and its tag per line, blank lines between sentences.

    bert-jax finetune --config=configs/finetune/token_classification.py --workdir=runs/ner \
        --config.init_from=runs/tiny --config.data.train=train.conll --config.data.validation=dev.conll

Tags go on each word's first word-piece; prints entity F1 (precision and recall per type).
POS tagging: --config.task.tagging=pos (token accuracy).
"""
from bert_jax.configs.finetune import common


def get_config():
    c = common.get_config("token_classification")
    c.data.format = "conll"
    return c
