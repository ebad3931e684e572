"""ALBERT-xlarge (Lan et al. 2020): 24 layers sharing one set of parameters, hidden 2048, 16 heads, MLP 8192,
128-dim embeddings; 59.0M params (as AlbertForPreTraining).

    bert-jax pretrain --config=configs/albert_xlarge.py --workdir=gs://BUCKET/albert_xlarge \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

The paper's recipe (§4.1) is ALBERT-base's: batch 4096 x 512, LAMB lr 0.00176, 125K steps,
SOP + n-gram masking; see configs/albert_base.py. `:tiny` is ALBERT-base's tiny variant.
"""
from bert_jax.configs import albert_base


def get_config(arg: str | None = None):
    c = albert_base.get_config()
    c.model.hidden_size = 2048
    c.model.num_layers = 24
    c.model.num_heads = 16
    c.model.intermediate_size = 8192
    if arg == "tiny":
        albert_base.shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/albert_xlarge.py:{arg}: the only variant is 'tiny'")
    return c
