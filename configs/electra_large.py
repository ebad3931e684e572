"""ELECTRA-Large (Clark et al. 2020): 24 layers of 1024, a 1/4-size generator; 335.1M params as
ElectraForPreTraining (the discriminator), 51.3M as ElectraForMaskedLM (the generator, embeddings shared).

    bert-jax pretrain --config=configs/electra_large.py --workdir=gs://BUCKET/electra_large \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

then `bert-jax export` as for configs/electra_base.py. Memory on 8 and 64 devices:
`bert-jax plan --config=configs/electra_large.py --num_devices=8` (docs/guides/families.md, "ELECTRA").

The paper's recipe (Table 6), kept here: sequences of 512 with 25% masked, generator 1/4 (256 wide,
4 heads, FFN 1024), lambda = 50, Adam at lr 2e-4, 10K warmup, linear decay, weight decay 0.01,
batch 2048 for 400K steps (1.75M for ELECTRA-1.75M), dropout 0.1. At 2048 x 512 this needs a pod
slice; on fewer chips keep the global batch with --config.train.grad_accum_steps. Differences from
the paper: as configs/electra_base.py.

Tiny variant (`:tiny`): as configs/electra_small.py's.
"""
from bert_jax.configs import electra_small


def get_config(arg: str | None = None):
    c = electra_small.get_config()
    c.model.hidden_size = 1024
    c.model.embedding_size = 1024
    c.model.num_layers = 24
    c.model.num_heads = 16
    c.model.intermediate_size = 4096
    c.model.generator_size_ratio = 1 / 4
    c.data.max_seq_length = 512
    c.data.mask_rate = 0.25
    c.train.global_batch_size = 2048
    c.train.num_steps = 400_000
    c.train.learning_rate = 2e-4
    if arg == "tiny":
        electra_small.shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/electra_large.py:{arg}: the only variant is 'tiny'")
    return c
