"""Stage 2, documents -> token ids: the tokenizer kinds, their training on a sample, loading, saving and extension."""
