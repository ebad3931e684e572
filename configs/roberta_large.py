"""RoBERTa-large (Liu et al. 2019): 24 layers, hidden 1024, 16 heads, MLP 4096; 355.4M params
(as RobertaForMaskedLM).

    bert-jax pretrain --config=configs/roberta_large.py --workdir=gs://BUCKET/roberta_large \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

The paper's recipe (Table 9): as RoBERTa-base (batch 8K x 512, 500K steps, Adam b2 0.98)
but peak lr 4e-4 and 30K warmup steps. `:tiny` is RoBERTa-base's tiny variant.
"""
from bert_jax.configs import roberta_base


def get_config(arg: str | None = None):
    c = roberta_base.get_config()
    c.model.hidden_size = 1024
    c.model.num_layers = 24
    c.model.num_heads = 16
    c.model.intermediate_size = 4096
    c.train.learning_rate = 4e-4
    c.train.warmup_steps = 30_000
    if arg == "tiny":
        roberta_base.shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/roberta_large.py:{arg}: the only variant is 'tiny'")
    return c
