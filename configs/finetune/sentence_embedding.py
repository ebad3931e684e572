"""Sentence embeddings, SBERT-style: a siamese encoder with mean pooling.

    bert-jax finetune --config=configs/finetune/sentence_embedding.py --workdir=runs/sbert \
        --config.init_from=runs/tiny --config.data.train=pairs.csv --config.data.validation=sts_dev.csv

Trains on `sentence1,sentence2` pairs with in-batch negatives (embedding_loss=ranking); cosine
(a numeric `score`) and softmax (a `label`, NLI-style) are the other losses. Prints the Spearman
correlation of cosine similarities with the validation file's `score`.
Export: bert-jax finetune-export --workdir=runs/sbert --out=OUT writes a
sentence-transformers folder.
"""
from bert_jax.configs.finetune import common


def get_config():
    c = common.get_config("sentence_embedding")
    c.task.text_fields = "sentence1,sentence2"
    c.task.pooling = "mean"
    return c
