"""ELECTRA-Base (Clark et al. 2020): a 1/3-size generator fills the masks, BERT-base's shape learns which tokens
were replaced; 109.5M params as ElectraForPreTraining (the discriminator), 33.7M as ElectraForMaskedLM (the
generator, embeddings shared with the discriminator, so counted in both).

    bert-jax pretrain --config=configs/electra_base.py --workdir=gs://BUCKET/electra_base \
        --config.data.source=text --config.data.path='gs://BUCKET/corpus/*.txt'

then `bert-jax export --workdir=gs://BUCKET/electra_base --out=electra_hf` writes the
discriminator (`transformers.ElectraForPreTraining` / `AutoModel` load it, with its tokenizer) and
the generator beside it in `electra_hf/generator` (`AutoModelForMaskedLM`).

The paper's recipe (Table 6), kept here: WordPiece vocabulary of 30522 (BERT's), sequences of 512,
15% masked, generator 1/3 of the hidden size, FFN and heads, embeddings shared, lambda = 50,
sampling temperature 1, Adam (eps 1e-6) at lr 2e-4, 10K warmup, linear decay, weight decay 0.01,
batch 256 for 766K steps, dropout 0.1 and attention dropout 0.1. Differences: attention dropout
is 0 by default as everywhere here (`--config.model.attention_dropout_rate=0.1` restores it; the
xla kernel then runs), masking is BERT's 80/10/10 (the paper's code uses 85% [MASK], 15% kept),
and the examples are FULL-SENTENCES rows without the second segment.

Tiny variant (`:tiny`): configs/electra_small.py's, 1500 steps on the embedded corpus with a WordPiece of 2048
trained first: a few minutes on a busy 2-core CPU; see configs/electra_small.py for what it reaches.
"""
from bert_jax.configs import electra_small


def get_config(arg: str | None = None):
    c = electra_small.get_config()
    c.model.hidden_size = 768
    c.model.embedding_size = 768  # no projection: E = H
    c.model.num_heads = 12
    c.model.intermediate_size = 3072
    c.model.generator_size_ratio = 1 / 3  # 256 wide, 4 heads, FFN 1024 (google/electra-base-generator)
    c.data.max_seq_length = 512
    c.train.global_batch_size = 256
    c.train.num_steps = 766_000
    c.train.learning_rate = 2e-4
    if arg == "tiny":
        electra_small.shrink_to_tiny(c)
    elif arg:
        raise ValueError(f"--config=configs/electra_base.py:{arg}: the only variant is 'tiny'")
    return c
