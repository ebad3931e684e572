"""bert_jax: pre-training BERT-family encoders with JAX and Flax linen.

Entry points live in `bert_jax.pretrain` (and `bert_jax.cli` for the `bert-jax`
console script); the library parts are `models`, `objectives`, `train`,
`checkpoint` and `parallel`.
"""
