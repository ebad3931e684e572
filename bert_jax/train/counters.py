"""A run's counters past 2^31 steps: the integer types that carry them, and the two places that needed a wider one.

JAX computes in 32 bits unless told otherwise (jax_enable_x64 is off, as in every JAX codebase we follow), so every
counter on the device is 32 bits wide. An int32 step counter wraps to a negative number at 2^31 (2,147,483,648) and
optax's schedule count, incremented with optax.safe_increment, stops there: the learning rate would freeze, a WSD run
would never finish its decay. Both are uint32 here, which reaches 2^32 - 1 (4,294,967,295 steps: 136 years at ten
steps a second). tests/test_counters.py resumes a run at step 2^31 - 16 and trains 32 steps across the boundary.

| counter | carried as | good to |
|---|---|---|
| the train state's step (`TrainState.step`) | uint32 on the device; a Python int on the host | 2^32 - 1 |
| the schedule's count (optax's `ScaleByScheduleState.count`, `scale_by_learning_rate` below) | uint32 | 2^32 - 1 |
| Adam's and LAMB's bias-correction count | int32, stopping at 2^31 - 1 (optax.safe_increment) | any step: 1 - 0.9^count is 1.0 in float32 from count ~ 160 on |
| the RNG folds, fold_in(key, step) | uint32 (fold_in's data) | 2^32 - 1; below 2^31 the same bits as the int32 step of older runs |
| the data position (the grain iterator's state) | Python ints in JSON | unbounded |
| metrics rows' `step`, checkpoint folder names, goodput records, `steps_replayed` | Python ints (JSON) | unbounded |
| tokens seen (`train/tokens_seen`) | a Python int, logged as a float64 | exact to 2^53 (9.0e15 tokens); TensorBoard stores its scalars as float32 (7 digits) |

A checkpoint written with an int32 step restores into the uint32 one (orbax casts to the target's dtype), so older
runs resume unchanged. A schedule reads its count as uint32, and is built from config.train's step counts as uint32
(`with_uint32_steps`: JAX takes a Python int for an int32 and refuses one past 2^31); a difference of two counts must
not go below zero (`_decay` clamps it). The host evaluates a schedule at a step through `schedule_at`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

STEP_DTYPE = jnp.uint32
# The keys of config.train that schedules read as step counts.
STEP_KEYS = ("num_steps", "warmup_steps", "decay_steps", "decay_from_step")


def scale_by_learning_rate(schedule: optax.Schedule) -> optax.GradientTransformation:
    """optax.scale_by_learning_rate(schedule) with a uint32 count: the same state (optax's ScaleByScheduleState, so
    a checkpoint's layout is unchanged), good to 2^32 - 1 updates instead of stopping at 2^31 - 1."""

    def init_fn(params):
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], STEP_DTYPE))

    def update_fn(updates, state, params=None):
        del params
        step_size = -schedule(state.count)
        updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformation(init_fn, update_fn)


def with_uint32_steps(train_cfg) -> ml_collections.ConfigDict:
    """A copy of config.train whose step counts (STEP_KEYS, those set) are uint32, for the schedules to be built
    from: a schedule compares its uint32 count with them, and JAX refuses a Python int past 2^31 beside one (it
    would take it for an int32)."""
    view = ml_collections.ConfigDict(train_cfg.to_dict(), type_safe=False)
    for key in STEP_KEYS:
        value = view.get(key)
        if isinstance(value, int) and value >= 0:
            view[key] = np.uint32(value)
    return view


def schedule_at(schedule: optax.Schedule, count: int) -> float:
    """The schedule's value at `count` (the step before the one it trains), evaluated on the host as the step
    evaluates it: a Python int past 2^31 would not convert to JAX's int32."""
    return float(schedule(jnp.asarray(count, STEP_DTYPE)))


def token_spans(stages, config) -> list[tuple[int, int, int]]:
    """[(start step, end step, tokens per step)] of the run's stages (bert_jax/train/stages.py plan; none: `config`'s
    one stage): a step's tokens are its global batch x max_seq_length, padding included."""
    per_step = lambda c: c.train.global_batch_size * c.data.max_seq_length  # noqa: E731
    return [(s.start, s.end, per_step(s.config)) for s in stages] or [(0, config.train.num_steps, per_step(config))]


def tokens_seen(step: int, spans: list[tuple[int, int, int]]) -> int:
    """Tokens the first `step` steps trained on, padding included: `spans` [(start step, end step, tokens per step)]
    of the run's stages, in order (a run without stages has one). Python ints: exact at any size."""
    return sum(max(0, min(step, end) - start) * per_step for start, end, per_step in spans)
