"""Optimizer and learning-rate schedule, all from optax."""
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bert_jax.registry import Registry
from bert_jax.train import counters
from bert_jax.train.counters import count
from bert_jax.train.budget_clock import BudgetClock

# config.train.optimizer -> (schedule, b1, b2, eps, weight_decay, mask, flat_moments) -> the optimizer it names.
OPTIMIZERS: Registry = Registry("config.train.optimizer", "optimizers")


def adam_moments(b1: float, b2: float, eps: float, flat: bool) -> optax.GradientTransformation:
    """Adam's moment update, per parameter leaf or (`flat`, config.train.flat_moments) over one buffer.

    Per leaf, the update is a few small elementwise kernels for each of ~200 leaves (BERT-base); over one
    raveled buffer (optax.flatten) it is a few large ones, plus a concatenate and slices. Adam is
    elementwise, so the two give the same numbers; the flat moments carry no logical axis names, so they
    are replicated on every device: a variant for one-device GPU runs (docs/results/gpu.md).
    """
    moments = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)
    return optax.flatten(moments) if flat else moments


def scale_by_multipliers(multipliers) -> optax.GradientTransformation:
    """Each leaf's update times its multiplier (a tree of floats shaped like the params): μP's per-role learning
    rates (bert_jax/models/parametrization.py). Stateless; a multiplier of 1 leaves its leaf untouched."""
    def scale(updates, params=None):
        del params
        return jax.tree.map(lambda factor, u: u if factor == 1.0 else u * jnp.asarray(factor, u.dtype),
                            multipliers, updates)

    return optax.stateless(scale)


def per_leaf(multipliers) -> list[optax.GradientTransformation]:
    """[scale_by_multipliers] when there are multipliers (μP), else nothing: the standard chain stays as it was."""
    return [] if multipliers is None else [scale_by_multipliers(multipliers)]


@OPTIMIZERS.register("adamw")
def adamw(schedule, b1, b2, eps, weight_decay, mask, flat_moments=False,
          multipliers=None) -> optax.GradientTransformation:
    """optax.adamw's chain, with the moments per leaf or flat. μP's multipliers scale Adam's direction before the
    decay is added, so learning rate x weight decay stays as set (mup's MuAdam with decoupled_wd=False)."""
    return optax.chain(adam_moments(b1, b2, eps, flat_moments), *per_leaf(multipliers),
                       optax.add_decayed_weights(weight_decay, mask), counters.scale_by_learning_rate(schedule))


@OPTIMIZERS.register("lamb")
def lamb(schedule, b1, b2, eps, weight_decay, mask, flat_moments=False,
         multipliers=None) -> optax.GradientTransformation:
    """optax.lamb's chain (the trust ratio stays per leaf), with the moments per leaf or flat. μP's multipliers come
    after the trust ratio, which would normalise them away before it."""
    return optax.chain(adam_moments(b1, b2, eps, flat_moments), optax.add_decayed_weights(weight_decay, mask),
                       optax.scale_by_trust_ratio(), *per_leaf(multipliers), counters.scale_by_learning_rate(schedule))

# config.train.schedule -> (train_cfg, warmup ramp) -> the schedule; each starts with a linear warmup from 0 to the
# peak over `warmup_steps` (the ramp).
SCHEDULES: Registry = Registry("config.train.schedule", "schedules")


def learning_rate_schedule(train_cfg) -> optax.Schedule:
    """`config.train.schedule`, each with a linear warmup from 0 to the peak over `warmup_steps`:

    linear  then linear decay to `end_learning_rate` at `num_steps` (BERT's; the default)
    wsd     warmup-stable-decay (ModernBERT's trapezoid): the peak until the last `decay_fraction` of
            `num_steps`, then a 1-sqrt decay to `end_learning_rate` (Hägele et al. 2024)
    cosine  then a cosine decay to `end_learning_rate` at `num_steps`
    constant  then the peak: a stable phase whose decays are branches (bert_jax/train/branch.py)
    decay   a decay branch: from `decay_from_learning_rate` (the parent's rate at the branch step) to
            `end_learning_rate` over `decay_steps`, `linear` or `1-sqrt` (`decay_shape`); no warmup
    onecycle  a triangle (Smith & Topin's one cycle, Cramming's budget-triangle): linear from
            `onecycle_start_factor` x the peak up to the peak over `onecycle_peak_fraction` of `num_steps`, then
            linear down to `end_learning_rate` at the last step; the rise is its warmup
    """
    clock = BudgetClock.of(train_cfg)
    if clock is not None:  # under config.train.budget: the schedule as written, run by the fraction of it spent
        schedule = clock.compose(learning_rate_schedule(clock.schedule_view(train_cfg)))
    else:
        # Positions in Python ints, handed to optax as uint32 (counters.count): its count is uint32, past 2^31 too.
        ramp = optax.linear_schedule(0.0, train_cfg.learning_rate, count(max(train_cfg.warmup_steps, 1)))
        schedule = SCHEDULES.get(train_cfg.schedule)(train_cfg, ramp)
    # Any count the schedule is given, a Python int on the host too, as the step's uint32: numpy's scalars would
    # wrap (and warn) where optax subtracts a boundary from a count below it.
    return lambda step: schedule(jnp.asarray(step, counters.STEP_DTYPE))


@SCHEDULES.register("linear")
def _linear(train_cfg, ramp) -> optax.Schedule:
    peak, end, total, warmup = (train_cfg.learning_rate, train_cfg.end_learning_rate, train_cfg.num_steps,
                                train_cfg.warmup_steps)
    decay = optax.linear_schedule(peak, end, count(max(total - warmup, 1)))
    return optax.join_schedules([ramp, decay], [count(warmup)])


@SCHEDULES.register("wsd")
def _warmup_stable_decay(train_cfg, ramp) -> optax.Schedule:
    peak, end, total, warmup = (train_cfg.learning_rate, train_cfg.end_learning_rate, train_cfg.num_steps,
                                train_cfg.warmup_steps)
    fraction = train_cfg.decay_fraction
    if not 0 < fraction <= 1:
        raise ValueError(f"config.train.decay_fraction={fraction} must be in (0, 1]")
    decay_steps = max(int(round(fraction * total)), 1)
    stable_until = max(total - decay_steps, warmup)
    # 1-sqrt from the peak to `end`; optax's polynomial_schedule gives (1 - t/T)^p, not 1 - (t/T)^p.
    sqrt_decay = lambda step: end + (peak - end) * (  # noqa: E731
        1.0 - jnp.sqrt(jnp.clip(step / count(decay_steps), 0.0, 1.0)))
    return optax.join_schedules([ramp, optax.constant_schedule(peak), sqrt_decay],
                                [count(warmup), count(stable_until)])


@SCHEDULES.register("cosine")
def _cosine(train_cfg, ramp) -> optax.Schedule:
    del ramp  # optax's warmup_cosine_decay_schedule holds the same warmup
    peak, end, total, warmup = (train_cfg.learning_rate, train_cfg.end_learning_rate, train_cfg.num_steps,
                                train_cfg.warmup_steps)
    return optax.warmup_cosine_decay_schedule(0.0, peak, count(warmup), count(max(total, warmup + 1)), end)


@SCHEDULES.register("constant")
def _constant(train_cfg, ramp) -> optax.Schedule:
    return optax.join_schedules([ramp, optax.constant_schedule(train_cfg.learning_rate)],
                                [count(train_cfg.warmup_steps)])


@SCHEDULES.register("onecycle")
def _onecycle(train_cfg, ramp) -> optax.Schedule:
    """Two lines joined at the peak: the first step trains at start_factor x the peak, step round(peak_fraction x
    num_steps) at the peak, the last step at end_learning_rate; torch's OneCycleLR(anneal_strategy="linear",
    three_phase=False) where peak_fraction x num_steps is a whole number (tests/test_training_parity.py).
    Geiping & Goldstein 2022 (§4.3) found this triangle best for a fixed budget; their released recipe starts at
    0.25 x the peak and peaks at 0.75 of the budget (cramming's budget-triangle2)."""
    del ramp  # the rise is the warmup
    peak, end, total = train_cfg.learning_rate, train_cfg.end_learning_rate, train_cfg.num_steps
    fraction, factor = train_cfg.onecycle_peak_fraction, train_cfg.onecycle_start_factor
    if not 0 < fraction < 1:
        raise ValueError(f"config.train.onecycle_peak_fraction={fraction} must be in (0, 1): the share of "
                         f"config.train.num_steps over which the rate rises to its peak")
    if not 0 <= factor <= 1:
        raise ValueError(f"config.train.onecycle_start_factor={factor} must be in [0, 1]: the first step's rate "
                         f"as a share of config.train.learning_rate")
    if train_cfg.warmup_steps:
        raise ValueError(f"config.train.warmup_steps={train_cfg.warmup_steps} with config.train.schedule='onecycle',"
                         f" whose rise is its warmup: set warmup_steps=0 and shape the rise with "
                         f"onecycle_peak_fraction and onecycle_start_factor")
    # The peak's count (the first step's is 0): at most total - 2, so that a run of 2 steps or more ends at `end`.
    rise = min(max(int(round(fraction * total)), 1) - 1, max(total - 2, 0))
    return optax.join_schedules([optax.linear_schedule(factor * peak, peak, count(rise)),
                                 optax.linear_schedule(peak, end, count(max(total - 1 - rise, 0)))], [count(rise)])


# config.train.decay_shape -> f(t), t in [0, 1]: the share of the way from the start rate to the end rate.
DECAY_SHAPES = {"linear": lambda t: t, "1-sqrt": jnp.sqrt}


@SCHEDULES.register("decay")
def _decay(train_cfg, ramp) -> optax.Schedule:
    """Step decay_from_step + 1 trains at the start rate and step decay_from_step + decay_steps at the end rate: the
    curve goes on from the parent's at the branch point and ends exactly where asked. (optax's count is the step
    before: step s trains at schedule(s - 1).)"""
    del ramp
    start, steps, shape = train_cfg.decay_from_step, train_cfg.decay_steps, train_cfg.decay_shape
    rate, end = train_cfg.decay_from_learning_rate, train_cfg.end_learning_rate
    if shape not in DECAY_SHAPES:
        raise ValueError(f"config.train.decay_shape={shape!r}; expected one of {', '.join(DECAY_SHAPES)}")
    if start < 0 or rate < 0:
        raise ValueError("config.train.schedule='decay' needs config.train.decay_from_step and "
                         "decay_from_learning_rate: set both, or branch (config.branch_from), which resolves them")
    if steps < 1:
        raise ValueError(f"config.train.decay_steps={steps} must be >= 1 (a branch resolves 0 to num_steps - "
                         f"its step)")
    fraction = DECAY_SHAPES[shape]

    first, span = count(start), count(max(steps - 1, 1))

    def schedule(step):
        # Clamped before the difference: the count is uint32 (bert_jax/train/counters.py), where step - start wraps.
        t = jnp.clip((jnp.maximum(step, first) - first) / span, 0.0, 1.0)
        return rate + (end - rate) * fraction(t)

    return schedule


_decay.starts_from_a_parent = True  # a branch resolves decay_from_step and decay_from_learning_rate (train/branch.py)


def decay_mask(params):
    """True for parameters that take weight decay: not LayerNorm scales, not biases (as BERT)."""

    def takes_decay(path, _):
        names = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
        return names[-1] not in ("bias", "scale") and not names[-1].endswith("_bias")

    return jax.tree_util.tree_map_with_path(takes_decay, params)


class NewRowsFirstState(NamedTuple):
    count: jax.Array  # updates seen
    first_rows: Any  # per param: the first row it may change during the warmup (its row count: none)


def new_rows_first(warmup_steps: int, first_new_row: int) -> optax.GradientTransformation:
    """For the first `warmup_steps` updates, only the rows from `first_new_row` on of the token-indexed params
    (logical axis `vocab` first: word embeddings, MLM output biases) change; every other update is zeroed.

    After extend-vocab this trains the new words' rows (and biases) alone before the whole model, the
    warmup of exBERT-style vocabulary extension; the rows below stay bit-identical meanwhile. Which params
    are token-indexed is read once, from the logical names of the boxed params `init` is given (as
    bert_jax.train.state builds the optimizer state), and kept in the state as one int per param.
    """

    def first_row(leaf) -> jax.Array:
        names = leaf.names if isinstance(leaf, nn.LogicallyPartitioned) else ()
        value = nn.meta.unbox(leaf)
        rows = value.shape[0] if value.ndim else 0
        return jnp.asarray(first_new_row if names and names[0] == "vocab" else rows, jnp.int32)

    def init(params) -> NewRowsFirstState:
        is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731
        return NewRowsFirstState(jnp.zeros([], jnp.int32), jax.tree.map(first_row, params, is_leaf=is_box))

    def update(updates, state: NewRowsFirstState, params=None):
        del params
        warming = state.count < warmup_steps

        def masked(update, first):
            rows = jnp.arange(update.shape[0] if update.ndim else 1).reshape((-1,) + (1,) * max(update.ndim - 1, 0))
            keep = ~warming | (rows >= first)
            return jnp.where(keep if update.ndim else keep[0], update, jnp.zeros_like(update))

        updates = jax.tree.map(masked, updates, state.first_rows)
        return updates, NewRowsFirstState(optax.safe_increment(state.count), state.first_rows)

    return optax.GradientTransformation(init, update)


def make_optimizer(train_cfg, multipliers=None) -> optax.GradientTransformation:
    """`config.train`'s optimizer; `multipliers`: μP's learning-rate multipliers, a tree of floats shaped like the
    params (bert_jax.families.mup_multipliers), or None (standard)."""
    make = OPTIMIZERS.get(train_cfg.optimizer)
    warmup_new_rows, first_new_row = train_cfg.new_rows_warmup_steps, train_cfg.new_rows_start
    if warmup_new_rows and first_new_row <= 0:
        raise ValueError(f"config.train.new_rows_warmup_steps={warmup_new_rows} needs config.train.new_rows_start: "
                         f"the first new token id (extend-vocab's report gives it)")
    schedule = learning_rate_schedule(train_cfg)
    opt = make(
        schedule, b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
        weight_decay=train_cfg.weight_decay, mask=decay_mask,
        flat_moments=train_cfg.flat_moments, multipliers=multipliers,
    )
    if warmup_new_rows:
        opt = optax.chain(opt, new_rows_first(warmup_new_rows, first_new_row))
    if train_cfg.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(train_cfg.max_grad_norm), opt)
    return opt
