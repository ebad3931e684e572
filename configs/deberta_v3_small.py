"""DeBERTa-v3-small (He et al. 2023): 6 layers, hidden 768, 12 heads, MLP 3072, with base's disentangled attention
and 128K vocabulary. The discriminator is DebertaV2Model's 141.3M params (44M backbone + 98M
embeddings) plus the replaced-token head; the generator (120.8M as DebertaV2ForMaskedLM) shares its table.

    bert-jax pretrain --config=configs/deberta_v3_small.py --workdir=gs://BUCKET/deberta_v3_small \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

The recipe is base's (configs/deberta_v3_base.py) at peak lr 6e-4. `:tiny` is base's tiny variant.
"""
from bert_jax.configs import deberta_v3_base


def get_config(arg: str | None = None):
    c = deberta_v3_base.get_config()
    c.model.num_layers = 6
    c.model.generator_num_layers = 3  # half the discriminator's
    c.model.hidden_size = 768
    c.model.num_heads = 12
    c.model.intermediate_size = 3072
    c.train.learning_rate = 6e-4
    if arg == "tiny":
        deberta_v3_base.shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/deberta_v3_small.py:{arg}: the only variant is 'tiny'")
    return c
