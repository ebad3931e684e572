"""Every config key that counts steps, and what a budget (config.train.budget, bert_jax/train/budget.py) does with it.

A budget stretches the schedule as written onto the steps it buys (bert_jax/train/budget_clock.py). A key that places
something on that schedule must follow the clock, or the budget must be refused beside it: a key left counting run
steps would switch at the step as written while everything else switched at its share of the budget. The table
below is the one list; budget.resolve refuses the REFUSED keys that are set, and tests/test_budget.py fails when a
config gains a key that looks step-keyed (a name with step, schedule, every, warmup, stage, ramp, fraction or switch
in it, or a value of (step, value) pairs) and is not here.

- CLOCK: a position on the schedule as written, read through the clock (the learning rate: optimizer.py; the stages,
  the batch ramp and the mask-rate schedule: stages.py).
- REFUSED: a schedule the clock does not drive; a budget beside it is refused in one line naming both keys.
- CADENCE: a count of the run's own steps (logging, evaluation, checkpoints, profiling, dispatch), the same under
  any budget: what it paces is not part of the schedule.
- NOT_STEPS: a name that looks step-keyed but counts something else.
"""
from __future__ import annotations

CLOCK = "on the schedule as written, read through the budget's clock"
REFUSED = "refused beside a budget"
CADENCE = "the run's own steps, the same under any budget"
NOT_STEPS = "not a step count"

# config key (as a dotted path) -> (kind, why)
STEP_KEYED = {
    "train.num_steps": (CLOCK, "the schedule's length as written; the resolved config's is the steps bought"),
    "train.warmup_steps": (CLOCK, "the learning rate's warmup"),
    "train.decay_steps": (CLOCK, "a decay schedule's length"),
    "train.decay_from_step": (CLOCK, "a decay schedule's start"),
    "train.stages": (CLOCK, "each stage's start"),
    "train.batch_size_warmup": (CLOCK, "the batch ramp's stages, placed by tokens on the schedule as written"),
    "data.mask_rate_schedule": (CLOCK, "the mask rate's stages"),
    "train.objective_switch": (CLOCK, "the objective's stage, at a share of the schedule as written"),
    "train.decay_fraction": (CLOCK, "the WSD decay's share of the schedule as written"),
    "train.onecycle_peak_fraction": (CLOCK, "the one-cycle peak's share of the schedule as written"),
    "data.mixture_schedule": (REFUSED, "the mixture's weights switch at batch indices, which the clock does not "
                                       "drive"),
    "data.mixture_alpha_schedule": (REFUSED, "the mixture's alpha switches at batch indices, which the clock does "
                                             "not drive"),
    "branch_from": (REFUSED, "a branch goes on along its parent's steps"),
    "branch.first_step": (REFUSED, "resolved for a branch (config.branch_from), which a budget refuses"),
    "train.new_rows_warmup_steps": (REFUSED, "the new rows' warmup counts optimizer updates, which the clock does "
                                             "not drive"),
    "train.log_every_steps": (CADENCE, "a log row"),
    "train.eval_every_steps": (CADENCE, "an evaluation"),
    "eval.downstream_every_steps": (CADENCE, "a downstream probe"),
    "checkpoint.every_steps": (CADENCE, "a checkpoint"),
    "checkpoint.keep_every_steps": (CADENCE, "a checkpoint kept for good"),
    "train.profile.start_step": (CADENCE, "a profiler window"),
    "train.profile.num_steps": (CADENCE, "a profiler window's length"),
    "train.budget_calibration_steps": (CADENCE, "the steps a wall-clock budget's first start times"),
    "train.max_steps_ahead": (CADENCE, "dispatched steps the host may run ahead of the device"),
    "train.grad_accum_steps": (NOT_STEPS, "micro-batches per step"),
    "train.batch_size_warmup.start_batch_size": (NOT_STEPS, "a batch size"),
    "train.budget_step_s": (NOT_STEPS, "seconds per step"),
    "train.schedule": (NOT_STEPS, "the learning rate schedule's name"),
    "train.onecycle_start_factor": (NOT_STEPS, "a share of the peak learning rate"),
    "train.new_rows_start": (NOT_STEPS, "a token id"),
    "branch.reset_step": (NOT_STEPS, "a switch"),
    "model.global_attn_every_n_layers": (NOT_STEPS, "layers"),
    "data.eval_fraction": (NOT_STEPS, "a share of the documents"),
}


def of_kind(kind: str) -> tuple[str, ...]:
    return tuple(key for key, (k, _) in STEP_KEYED.items() if k == kind)


def value_at(config, key: str):
    """The value of `key` (a dotted path) in `config`, None where it is absent."""
    node = config
    for part in key.split("."):
        if not hasattr(node, "get"):
            return None
        node = node.get(part)
    return node


def refused_beside_a_budget(config) -> str | None:
    """The first REFUSED key `config` sets, as `config.KEY`, with why; None when it sets none."""
    for key in of_kind(REFUSED):
        value = value_at(config, key)
        if value not in (None, "", (), [], 0, -1):
            return f"config.{key}: {STEP_KEYED[key][1]}"
    return None
