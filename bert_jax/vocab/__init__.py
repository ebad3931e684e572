"""Vocabulary extension: mine a domain corpus for fragmented words, add them, grow the embedding rows.

`mining` finds the words a tokenizer splits most; `extension` runs the whole job (the
`bert-jax extend-vocab` command is `bert_jax/commands/extend_vocab.py`); `rows` initialises the new
embedding rows from the old pieces. Adding words to a tokenizer itself is a tokenizer operation
(`data_pipelines/tokenizers/extension.py`).
"""
