"""DeBERTa-v3-large (He et al. 2023): 24 layers, hidden 1024, 16 heads, MLP 4096, with base's disentangled attention
and 128K vocabulary. The discriminator is DebertaV2Model's 434.0M params (304M backbone + 131M
embeddings) plus the replaced-token head; the generator (284.0M as DebertaV2ForMaskedLM) shares its table.

    bert-jax pretrain --config=configs/deberta_v3_large.py --workdir=gs://BUCKET/deberta_v3_large \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

The recipe is base's (configs/deberta_v3_base.py) at peak lr 3e-4. `:tiny` is base's tiny variant.
"""
from bert_jax.configs import deberta_v3_base


def get_config(arg: str | None = None):
    c = deberta_v3_base.get_config()
    c.model.num_layers = 24
    c.model.generator_num_layers = 12  # half the discriminator's
    c.model.hidden_size = 1024
    c.model.num_heads = 16
    c.model.intermediate_size = 4096
    c.train.learning_rate = 3e-4
    if arg == "tiny":
        deberta_v3_base.shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/deberta_v3_large.py:{arg}: the only variant is 'tiny'")
    return c
