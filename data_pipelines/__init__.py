"""Data for BERT pre-training, a folder per stage:

    sources/     sources -> documents (a registered class per config.data.source: files, TFDS, the embedded
                 corpus, and prepared shards, whose format sources/prepared.py holds; segmenters)
    tokenizers/  documents -> token ids (the tokenizer kinds, training, load/save, extension)
    shards/      token ids on disk: preparing ArrayRecord shards (`prepare`, `prepare_beam`)
    examples/    token ids -> examples (NSP/SOP pairs, packed rows)
    loader/      examples -> masks -> batches (the grain pipeline, shuffles, masking)

The stages are layers in that order (tests/test_import_graph.py): a stage imports only the ones before it.
index_shuffle.py, below them all, is the permutation the tokenizer's sample and the loader's shuffles share.
Every name a user picks (a source, tokenizer kind, example builder, masking mode) is looked up in its stage's
registry (bert_jax/registry.py), never compared with a string.

Its commands are `bert-jax prepare`, `prepare-beam` and `tokenizer` (bert_jax/commands/; `python -m
data_pipelines.X` runs them too).
Each stage is a function of its inputs (plus an explicit seed), so a later stage can be swapped
(e.g. a streaming ArrayRecord source) without touching the others. This package imports only the
path layer (`bert_jax.storage`), `bert_jax.registry` and `bert_jax.UserError` from bert_jax.
"""
