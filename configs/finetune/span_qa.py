"""Extractive question answering (SQuAD v1.1 / v2.0 JSON): the best span over doc-stride windows.

    bert-jax finetune --config=configs/finetune/span_qa.py --workdir=runs/qa \
        --config.init_from=runs/tiny --config.data.train=train-v2.0.json --config.data.validation=dev-v2.0.json

Contexts longer than max_seq_length are cut into windows sharing data.doc_stride tokens;
unanswerable questions (SQuAD 2.0) predict "". Prints exact match and F1 as the official script.
"""
from bert_jax.configs.finetune import common


def get_config():
    c = common.get_config("span_qa")
    c.data.format = "squad"
    c.data.max_seq_length = 384
    c.data.doc_stride = 128
    c.data.packing = False  # windows fill max_seq_length; the loss reads every position of a window
    return c
