"""What a budget buys on a target: `bert-jax plan --budget=24h --gpu=h100` (or --tpu=SLICE; or 2e9tokens, 3e18flops).

The run resolves `config.train.budget` into steps by stretching the schedule as written to spend it
(bert_jax/train/budget.py). The plan resolves it with the same function, `budget.clock_for`, so the table is the
run's clock, stage for stage:

- a wall-clock budget: the run times stage 0's step at its first start and takes each later stage's step to run at
  the same FLOP/s (its time scaled by its FLOPs per step). The plan puts stage 0's roofline bound in place of the
  measured time (bert_jax/plan/roofline.py: the longest of its FLOPs at peak, its HBM bytes at bandwidth and each
  link's overlapped collectives at that link's bandwidth, plus the collectives nothing overlaps) and scales the later
  stages the same way. No step runs faster than its bound, so the steps and tokens are an upper bound: the input
  pipeline, evaluation, checkpoints and compiles only slow a real step. A run on the target that measured exactly
  the bound would resolve exactly this table.
- a token or FLOP budget: the steps are exact (the run converts them the same way); the hours, at the same step
  times, are a lower bound.
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
    step_s: float | None  # the time of one step the clock takes (None: no roofline from this compiler)
    exact_step: bool = True  # False: stage 0's roofline is itself a lower bound (its FLOPs not counted in full)


def buys(budget: budget_lib.Budget, stage_plans: list) -> list[StageBuy]:
    """Each stage's steps and tokens under `budget`, from the planned stages (bert_jax/plan/stage_plans.py
    StagePlan): stage 0's compiled step's roofline gives the speed where its compiler has one."""
    first = stage_plans[0].step.plan
    roofline = first.roofline if first is not None else None
    return stage_buys(budget, [sp.stage for sp in stage_plans], None if roofline is None else roofline.step_s,
                      first is None or first.step_is_exact)


def stage_buys(budget: budget_lib.Budget, stages: list, step_s: float | None, exact_step: bool = True
               ) -> list[StageBuy]:
    """Each stage's steps and tokens under `budget`: `stages` (bert_jax/train/stages.py, the schedule as written),
    `step_s` stage 0's roofline step time or None; ValueError for a wall-clock budget without it."""
    if budget.unit == "seconds" and step_s is None:
        raise ValueError(f"--budget={budget.text} is wall-clock time: what it buys needs stage 0's roofline step "
                         "time, which --gpu=CARD (XLA's GPU compiler) or --tpu=SLICE gives; a token or FLOP budget "
                         "(2e9tokens, 3e18flops) converts without one")
    clock = budget_lib.clock_for(stages, budget, step_s or 0.0)
    times = budget_lib.stage_costs(stages, "seconds", step_s) if step_s is not None else [None] * len(stages)
    return [StageBuy(stage.index, (stage.start, stage.end), after - before,
                     (after - before) * counters.tokens_per_step(stage.config), t, exact_step)
            for stage, t, (before, *_), (after, *_) in zip(stages, times, clock, clock[1:])]


def format_buys(budget: budget_lib.Budget, bought: list[StageBuy], device: str) -> str:
    """Markdown: the table per stage and the line that says what kind of bound it is."""
    wall = budget.unit == "seconds"
    lines = ["", f"## what --budget={budget.text} buys on {device}", ""]
    scaled = " (a later stage's: stage 0's scaled by its FLOPs per step, as the run scales its measured stage 0)"
    if wall:
        lines.append("**An upper bound on steps and tokens**: stage 0's step at its roofline bound (the longest of its "
                     "FLOPs at peak, its HBM bytes at bandwidth and its collectives' bytes over each link, plus the "
                     f"collectives nothing overlaps){scaled if len(bought) > 1 else ''}. The input pipeline, "
                     "evaluation, checkpoints and compiles make every real step slower. The run resolves the same "
                     "clock (bert_jax/train/budget.py clock_for) from the speed it measures at its first start "
                     "(docs/guides/budget.md).")
    else:
        lines.append(f"Steps and tokens are exact: the run converts {budget.describe()} to steps the same way. "
                     "Hours are a lower bound: stage 0's roofline bound (collectives counted)"
                     f"{scaled if len(bought) > 1 else ''} for those steps.")
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
