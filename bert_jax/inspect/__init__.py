"""Looking inside a model: `views` (fill-mask candidates, attention maps); `python -m bert_jax.inspect` runs the command."""
