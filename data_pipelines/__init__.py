"""Data for BERT pre-training, a folder per stage:

    sources/     sources -> documents (files, TFDS, the embedded corpus; segmenters)
    tokenizers/  documents -> token ids (the tokenizer kinds, training, load/save, extension)
    shards/      token ids on disk: prepared ArrayRecord shards (`prepare`, `prepare_beam`)
    examples/    token ids -> examples (NSP/SOP pairs, packed rows)
    loader/      examples -> masks -> batches (the grain pipeline, shuffles, masking)

Its commands are `bert-jax prepare`, `prepare-beam` and `tokenizer` (bert_jax/commands/; `python -m
data_pipelines.X` runs them too).
Each stage is a function of its inputs (plus an explicit seed), so a later stage can be swapped
(e.g. a streaming ArrayRecord source) without touching the others. This package imports only the
path layer (`bert_jax.storage`) from bert_jax.
"""
