"""BERT-base (Devlin et al. 2019): 12 layers, hidden 768, 12 heads, MLP 3072, vocab 30522; ~110M params.

Both phases as one command, e.g. on a v4-32 slice: seq 128 for 90 % of the steps, then seq 512 for the
last 10 % (config.train.stages; bert_jax/train/stages.py):

    bert-jax pretrain --config=configs/bert_base.py --workdir=gs://BUCKET/bert_base

The recipe is the paper's: batch 256, 1M steps, AdamW lr 1e-4, warmup 10k, linear
decay to 0 at step 1M over both phases (one schedule: no jump at the switch), weight decay 0.01,
max_predictions_per_seq auto (20 at seq 128, 77 at 512). The step recompiles for seq 512 at step
900k; DONE is written once, at 1M. Expect MLM accuracy around 0.7 at the end of phase 1.
`data.source` must name a real corpus (see the data pipeline); the embedded default
corpus is far too small for this model.
"""
from bert_jax.configs import base


def get_config():
    c = base.get_config()
    c.train.num_steps = 1_000_000
    c.train.stages = (dict(start=900_000, data=dict(max_seq_length=512)),)  # phase 2: the last 10 % at seq 512
    c.checkpoint.every_steps = 5_000
    return c
