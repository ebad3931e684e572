"""The objective names that change what a model attends to and what the data pipeline feeds it.

`config.model.objective` picks a family's objective by name ("" = the family's own; bert_jax/families.py). Most
names change only the loss; a causal one also makes the model attend causally and the pipeline leave its batches
unmasked (the targets are the next tokens). The models and the pipeline sit below the objectives, so the name they
share lives here, at the bottom; `config.data.objective` is a reference to `config.model.objective`.
"""

CAUSAL_LM = "clm"  # next-token prediction over packed documents (bert_jax/objectives/causal_lm.py)


def is_causal(cfg) -> bool:
    """Whether `cfg` (config.model, or config.data through its reference) trains a causal objective."""
    return cfg.get("objective", "") == CAUSAL_LM
