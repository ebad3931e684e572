"""Pure Flax linen modules: layers, encoder families and their pre-training heads.

Importing this package registers every family with `registry`.
"""
from bert_jax.models import albert as _albert  # noqa: F401  (registers "albert")
from bert_jax.models import bert as _bert  # noqa: F401  (registers "bert")
from bert_jax.models import roberta as _roberta  # noqa: F401  (registers "roberta")
from bert_jax.models.registry import Family, get_family, known_families, register_family

__all__ = ["Family", "get_family", "known_families", "register_family"]
