"""ALBERT-xxlarge (Lan et al. 2020): 12 layers sharing one set of parameters, hidden 4096, 64 heads, MLP 16384,
128-dim embeddings; 223.2M params (as AlbertForPreTraining).

    bert-jax pretrain --config=configs/albert_xxlarge.py --workdir=gs://BUCKET/albert_xxlarge \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

The paper's recipe (§4.1) is ALBERT-base's: batch 4096 x 512, LAMB lr 0.00176, 125K steps,
SOP + n-gram masking; see configs/albert_base.py. `:tiny` is ALBERT-base's tiny variant.
"""
from bert_jax.configs import albert_base


def get_config(arg: str | None = None):
    c = albert_base.get_config()
    c.model.hidden_size = 4096
    c.model.num_layers = 12
    c.model.num_heads = 64
    c.model.intermediate_size = 16384
    if arg == "tiny":
        albert_base.shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/albert_xxlarge.py:{arg}: the only variant is 'tiny'")
    return c
