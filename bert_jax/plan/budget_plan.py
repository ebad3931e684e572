"""What a budget buys on a target: `bert-jax plan --budget=24h --gpu=h100` (or --tpu=SLICE; or 2e9tokens, 3e18flops).

The run resolves `config.train.budget` into steps by stretching the schedule as written to spend it, each stage's
steps x the budget / what the schedule as written costs (bert_jax/train/budget.py); this does the same with what the
plan knows of each stage's step, so the table is the run's clock as that target would resolve it:

- a wall-clock budget: each stage's step at its roofline bound (bert_jax/plan/roofline.py: its FLOPs at peak or its
  HBM bytes at bandwidth, whichever is longer), each stage compiled for the target. No step runs faster, so the
  steps and tokens are an upper bound: collectives, the input pipeline, evaluation, checkpoints and compiles only
  slow a real step. The run itself calibrates on the machine it runs on (bert_jax/train/budget_calibration.py).
- a token or FLOP budget: the steps are exact (the run converts them the same way); the hours, the roofline's
  time for those steps, are a lower bound.
"""
from __future__ import annotations

import dataclasses

from bert_jax.train import budget as budget_lib, counters


@dataclasses.dataclass(frozen=True)
class StageBuy:
    index: int
    schedule_steps: tuple[int, int]  # the stage's span on the schedule as written: (start, end]
    steps: int  # what the budget buys of it
    tokens: int
    step_s: float | None  # the roofline bound of one step (None: no roofline from this compiler)
    exact_step: bool = True  # False: step_s is itself a lower bound on the roofline's


def buys(budget: budget_lib.Budget, stage_plans: list) -> list[StageBuy]:
    """Each stage's steps and tokens under `budget`, from the planned stages (bert_jax/plan/stage_plans.py
    StagePlan: the stage and its compiled step, whose roofline gives the step's time where its compiler has one)."""
    rooflines = [sp.step.plan.roofline if sp.step.plan is not None else None for sp in stage_plans]
    return stage_buys(budget, [sp.stage for sp in stage_plans], [None if r is None else r.step_s for r in rooflines],
                      [sp.step.plan is None or sp.step.plan.step_is_exact for sp in stage_plans])


def stage_buys(budget: budget_lib.Budget, stages: list, step_s: list, exact_steps: list | None = None
               ) -> list[StageBuy]:
    """Each stage's steps and tokens under `budget`: `stages` (bert_jax/train/stages.py, the schedule as written),
    `step_s` each one's roofline step time or None; ValueError for a wall-clock budget without every step time."""
    if budget.unit == "seconds":
        if any(t is None for t in step_s):
            raise ValueError(f"--budget={budget.text} is wall-clock time: what it buys needs each stage's roofline "
                             "step time, which --gpu=CARD (XLA's GPU compiler) or --tpu=SLICE gives; a token or FLOP "
                             "budget (2e9tokens, 3e18flops) converts without one")
        costs = list(step_s)
    else:
        costs = budget_lib.stage_costs(stages, budget.unit)
    clock = budget_lib.budget_clock(stages, costs, budget.amount)
    exact_steps = exact_steps or [True] * len(stages)
    out = []
    for stage, t, exact, (before, *_), (after, *_) in zip(stages, step_s, exact_steps, clock, clock[1:]):
        steps = after - before
        out.append(StageBuy(stage.index, (stage.start, stage.end), steps,
                            steps * counters.tokens_per_step(stage.config), t, exact))
    return out


def format_buys(budget: budget_lib.Budget, bought: list[StageBuy], device: str) -> str:
    """Markdown: the table per stage and the line that says what kind of bound it is."""
    wall = budget.unit == "seconds"
    lines = ["", f"## what --budget={budget.text} buys on {device}", ""]
    if wall:
        lines.append("**An upper bound on steps and tokens**: each step at its roofline bound (its FLOPs at peak or "
                     "its HBM bytes at bandwidth, whichever is longer); collectives, the input pipeline, evaluation, "
                     "checkpoints and compiles make every real step slower. The run measures its own speed at its "
                     "first start and fixes its steps then (docs/guides/budget.md).")
    else:
        lines.append(f"Steps and tokens are exact: the run converts {budget.describe()} to steps the same way. "
                     "Hours are a lower bound: the roofline's time for those steps.")
    lines += ["", "| stage | schedule steps (as written) | steps | tokens | step (ms) | hours |",
              "|---|---|---|---|---|---|"]
    bound = "≤ " if wall else ""
    for b in bought:
        step_ms = "-" if b.step_s is None else f"{'≥ ' if not b.exact_step else ''}{b.step_s * 1e3:.3g}"
        hours = "-" if b.step_s is None else f"{'' if wall else '≥ '}{b.steps * b.step_s / 3600:.3g}"
        lines.append(f"| {b.index} | {b.schedule_steps[0] + 1:,}-{b.schedule_steps[1]:,} | {bound}{b.steps:,} | "
                     f"{bound}{b.tokens:.4g} | {step_ms} | {hours} |")
    if len(bought) > 1:
        known = all(b.step_s is not None for b in bought)
        total_h = sum(b.steps * b.step_s for b in bought) / 3600 if known else None
        hours = "-" if total_h is None else f"{'' if wall else '≥ '}{total_h:.3g}"
        lines.append(f"| all | 1-{bought[-1].schedule_steps[1]:,} | {bound}{sum(b.steps for b in bought):,} | "
                     f"{bound}{sum(b.tokens for b in bought):.4g} | | {hours} |")
    lines += ["", f"The schedule as written (config.train.num_steps={bought[-1].schedule_steps[1]:,}) runs over the "
              f"fraction of the budget spent: `bert-jax pretrain ... --config.train.budget={budget.text}`."]
    return "\n".join(lines)
