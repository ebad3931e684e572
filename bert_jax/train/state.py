"""The train state and its sharded initialisation."""
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from bert_jax.models import parametrization
from bert_jax.train import counters
from bert_jax.parallel.mesh import logical_shardings
from data_pipelines.loader import pipeline


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # uint32 scalar: optimizer updates applied so far (bert_jax/train/counters.py)
    params: Any
    opt_state: Any
    # Raw key data of the run's base key; per-step keys are fold_in(key, step), so
    # resuming needs nothing but this and the step.
    rng: jax.Array


@flax.struct.dataclass
class EmaTrainState(TrainState):
    """A TrainState that also keeps an exponential moving average of the params (config.train.ema_decay), updated by
    bert_jax/train/step.py. A class of its own rather than a field that is None when off: orbax records a None
    field as a key, so checkpoints written before the EMA existed would no longer match a plain run's state."""

    ema: Any


def example_batch(data_cfg, batch_size: int) -> dict:
    """A batch of zeros with the pipeline's keys, shapes and dtypes (pipeline.batch_spec).

    For `init` and ahead-of-time lowering; attention_mask is ones so no row is all padding.
    """
    spec = pipeline.batch_spec(data_cfg, batch_size)
    batch = {name: jnp.zeros(shape, dtype) for name, (shape, dtype) in spec.items()}
    batch["attention_mask"] = jnp.ones_like(batch["attention_mask"])
    return batch


def make_init_fn(model, tx: optax.GradientTransformation, data_cfg, seed: int, example: dict | None = None,
                 ema: bool = False, init_multipliers=None):
    """Returns init(boxed: bool) -> TrainState; boxed keeps the logical-axis metadata for shardings.

    `example`: a batch of the model's inputs (fine-tuning's); default: the pre-training pipeline's.
    `ema`: keep an EMA of the params (config.train.ema_decay > 0), starting at the initial params.
    `init_multipliers`: μP's factors on the initial values, a tree of floats shaped like the params
    (bert_jax.families.mup_multipliers); None (standard) leaves the module's init as it is.
    """

    def init(unbox: bool = True) -> TrainState:
        base = jax.random.key(seed)
        variables = model.init(
            {"params": jax.random.fold_in(base, 0), "dropout": jax.random.fold_in(base, 1)},
            example_batch(data_cfg, 1) if example is None else example, deterministic=True,
        )
        params = variables["params"]
        if init_multipliers is not None:
            params = parametrization.scale_tree(params, init_multipliers)
        # Optimizer state (and the EMA) is built from the boxed params so Adam's moments inherit
        # their logical names (and shardings) instead of ending up replicated.
        fields = dict(step=jnp.zeros((), counters.STEP_DTYPE), params=params, opt_state=tx.init(params),
                      rng=jax.random.key_data(base))
        state = EmaTrainState(**fields, ema=jax.tree.map(jnp.copy, params)) if ema else TrainState(**fields)
        return flax.linen.meta.unbox(state) if unbox else state

    return init


def abstract_state_and_shardings(init, mesh, rules):
    """ShapeDtypeStructs of the state, and the NamedShardings the rules give each leaf."""
    boxed = jax.eval_shape(lambda: init(unbox=False))
    shardings = logical_shardings(boxed, mesh, rules)
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        flax.linen.meta.unbox(boxed), shardings,
    )
    return abstract, shardings


def create_sharded_state(init, shardings) -> TrainState:
    """Initialises every leaf directly on its shards: no host ever holds the full state."""
    return jax.jit(init, out_shardings=shardings)()
