"""ModernBERT-large (Warner et al. 2024): 28 layers, 1024 wide, 16 heads, GeGLU of 2624; 395,881,664 params
(as ModernBertForMaskedLM).

    bert-jax pretrain --config=configs/modernbert_large.py --workdir=gs://BUCKET/modernbert_large \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

The paper's recipe is base's (configs/modernbert_base.py: sequence 1024 then context extension
to 8192, 30 % masking, WSD with a 1-sqrt decay, StableAdamW) with peak lr 5e-4 and weight
decay 1e-5; large was warm-started from base in the paper (Center tiling), which this
config does not do.

Tiny variant: base's tiny run (same code paths) with large's head count ratio:

    bert-jax pretrain --config=configs/modernbert_large.py:tiny --workdir=runs/modernbert_large_tiny
"""
from bert_jax.configs import base, modernbert_base


def get_config(arg: str | None = None):
    c = base.get_config()
    modernbert_base.set_modernbert(c)
    c.model.num_layers = 28
    c.model.hidden_size = 1024
    c.model.num_heads = 16
    c.model.intermediate_size = 2624
    c.train.learning_rate = 5e-4
    if arg == "tiny":
        modernbert_base.shrink_to_tiny(c)
        c.model.num_layers = 3  # one global layer, two local, to keep large's deeper stack in the small
        c.model.num_heads = 4
    elif arg:
        raise ValueError(f"--config=configs/modernbert_large.py:{arg}: the only variant is 'tiny'")
    return c
