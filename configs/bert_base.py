"""BERT-base (Devlin et al. 2019): 12 layers, hidden 768, 12 heads, MLP 3072, vocab 30522; ~110M params.

Phase 1 (seq 128, 90% of steps), e.g. on a v4-32 slice:

    python -m bert_jax.pretrain --config=configs/bert_base.py --workdir=gs://BUCKET/bert_base

Phase 2 (seq 512, the last 10% of steps), continuing in the same workdir:

    python -m bert_jax.pretrain --config=configs/bert_base.py --workdir=gs://BUCKET/bert_base \
        --config.data.max_seq_length=512 --config.data.max_predictions_per_seq=80 \
        --config.train.num_steps=1000000

The recipe is the paper's: batch 256, 1M steps, AdamW lr 1e-4, warmup 10k, linear
decay, weight decay 0.01. Expect MLM accuracy around 0.7 at the end of phase 1.
`data.source` must name a real corpus (see the data pipeline); the embedded default
corpus is far too small for this model.
"""
from configs import base


def get_config():
    c = base.get_config()
    c.train.num_steps = 900_000  # phase 1; phase 2 raises it to 1M with seq 512
    c.checkpoint.every_steps = 5_000
    return c
