"""Pure Flax linen modules: layers, encoder families and their pre-training heads.

Families are registered, with their objectives and HF converters, in `bert_jax.families`.
"""
