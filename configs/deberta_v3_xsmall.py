"""DeBERTa-v3-xsmall (He et al. 2023): 12 layers, hidden 384, 6 heads, MLP 1536, with base's disentangled attention
and 128K vocabulary. The discriminator is DebertaV2Model's 70.7M params (22M backbone + 48M
embeddings) plus the replaced-token head; the generator (60.3M as DebertaV2ForMaskedLM) shares its table.

    bert-jax pretrain --config=configs/deberta_v3_xsmall.py --workdir=gs://BUCKET/deberta_v3_xsmall \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

The recipe is base's (configs/deberta_v3_base.py) at peak lr 6e-4. `:tiny` is base's tiny variant.
"""
from bert_jax.configs import deberta_v3_base


def get_config(arg: str | None = None):
    c = deberta_v3_base.get_config()
    c.model.num_layers = 12
    c.model.generator_num_layers = 6  # half the discriminator's
    c.model.hidden_size = 384
    c.model.num_heads = 6
    c.model.intermediate_size = 1536
    c.train.learning_rate = 6e-4
    if arg == "tiny":
        deberta_v3_base.shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/deberta_v3_xsmall.py:{arg}: the only variant is 'tiny'")
    return c
