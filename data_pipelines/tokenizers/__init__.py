"""Stage 2, documents -> token ids: the tokenizer kinds, their training on a sample, loading, saving and extension.

A kind is one file here that registers its `TokenizerKind` (kinds.py); importing the package registers
each of them, in this order (the order of `known_kinds()`).
"""
# Imported for their registrations:
from data_pipelines.tokenizers import wordpiece  # noqa: F401
from data_pipelines.tokenizers import byte_bpe  # noqa: F401
from data_pipelines.tokenizers import sentencepiece  # noqa: F401
