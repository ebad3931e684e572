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
runs resume unchanged. A schedule reads its count as uint32. Its positions (warmup, decay start, a stage's end) are
computed from config.train's step counts in Python ints, exact at any size, and only the results are handed to JAX,
as uint32 (`count`: JAX takes a Python int for an int32 and refuses one past 2^31). Arithmetic on numpy's uint32
scalars would wrap below zero (and warn, "overflow encountered in scalar subtract"); on the device a difference of two
counts must not go below zero either (`_decay` clamps it). The host evaluates a schedule at a step through
`schedule_at`. The budget's clock (train/budget_clock.py) maps a run step to a schedule step in exact integer
arithmetic too, so its breakpoints land on the step counters' own values past 2^24 (float32's last exact integer)
and past 2^31.

A step's tokens (`tokens_per_step`: its global batch x max_seq_length, padding included) and the tokens of a run's
first steps (`tokens_seen` over `token_spans`) are counted here alone: the metrics rows, the budget, the budget's plan,
the compiled plan and the model card all read them from here.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

STEP_DTYPE = jnp.uint32


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


def count(steps: int) -> np.uint32:
    """A step count (a Python int, computed exactly) as a schedule compares it with its uint32 count: JAX refuses a
    Python int past 2^31 beside a uint32 (it takes it for an int32). ValueError outside [0, 2^32)."""
    steps = int(steps)
    if not 0 <= steps < 2**32:
        raise ValueError(f"a schedule's step count {steps} is outside [0, 2^32): the step counter is uint32")
    return np.uint32(steps)


def schedule_at(schedule: optax.Schedule, count: int) -> float:
    """The schedule's value at `count` (the step before the one it trains), evaluated on the host as the step
    evaluates it: a Python int past 2^31 would not convert to JAX's int32."""
    return float(schedule(jnp.asarray(count, STEP_DTYPE)))


def tokens_per_step(config) -> int:
    """Sequence positions one step of `config` (a stage's) trains on: its global batch x max_seq_length, padding
    included (a packed row's unused tail is padding too). The one place this product is taken."""
    return int(config.train.global_batch_size) * int(config.data.max_seq_length)


def token_spans(stages, config=None) -> list[tuple[int, int, int]]:
    """[(start step, end step, tokens per step)] of the run's stages (bert_jax/train/stages.py plan; none: `config`'s
    one stage)."""
    return ([(s.start, s.end, tokens_per_step(s.config)) for s in stages]
            or [(0, config.train.num_steps, tokens_per_step(config))])


def tokens_seen(step: int, spans: list[tuple[int, int, int]]) -> int:
    """Tokens the first `step` steps trained on, padding included: `spans` [(start step, end step, tokens per step)]
    of the run's stages, in order (a run without stages has one). Python ints: exact at any size."""
    return sum(max(0, min(step, end) - start) * per_step for start, end, per_step in spans)
