"""The shapes of a family module's parameters, learnt without allocating them.

Restoring a checkpoint needs an abstract target, and converters need the full tree a family
module initialises (pre-training heads included); both come from `jax.eval_shape` of `init`
on the smallest batch every family module accepts. Parameter shapes never depend on the
batch's shape (positions are sized by config.model.max_position_embeddings).
"""
import flax.linen as nn
import jax
import jax.numpy as jnp


def probe_batch(length: int = 8) -> dict:
    """The smallest batch every family module's __call__ accepts (for init and eval_shape)."""
    ids = jnp.zeros((1, length), jnp.int32)
    predictions = jnp.zeros((1, 1), jnp.int32)
    return {"input_ids": ids, "attention_mask": jnp.ones_like(ids), "token_type_ids": ids,
            "masked_positions": predictions, "masked_ids": predictions,  # replaced-token detection reads these
            "masked_weights": jnp.ones((1, 1), jnp.float32),
            # SpanBERT's boundary head reads these (data_pipelines/loader/span_boundaries.py)
            "masked_span_left": predictions, "masked_span_right": predictions, "masked_span_offset": predictions}


def abstract_params(model: nn.Module) -> dict:
    """The module's parameter tree as ShapeDtypeStructs (unboxed: no logical-axis metadata).

    Unboxed while traced: under a run's mesh and axis rules (a grown run reads its source there), unboxing applies
    the logical sharding constraint, which a ShapeDtypeStruct outside a trace cannot take.
    """
    return jax.eval_shape(
        lambda: nn.meta.unbox(model.init(jax.random.key(0), probe_batch(), deterministic=True)["params"]))
