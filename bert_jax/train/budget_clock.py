"""The schedule's clock under a budget: a run step -> the step of the schedule as written that it trains at.

A run sized by `config.train.budget` (bert_jax/train/budget.py) keeps its schedule as written: `train.num_steps`
steps of it, every position in it (warmup_steps, decay_fraction, onecycle's peak, the stages' starts, the batch and
mask-rate ramps) a step of that schedule. The budget buys another number of steps, and the run is that schedule
stretched to spend the budget: the share of the budget spent when the run reaches a point of the schedule is the
share of its own cost (tokens, FLOPs or seconds) the schedule as written has spent by that point. Every schedule thus
runs over the fraction of the budget spent, as Cramming's do (Geiping & Goldstein 2022; its schedulers feed
`elapsed / budget x num_training_steps` to a step-based schedule); a run in stages keeps the share of steps each
stage has as written (BERT's 90 % at seq 128), and a budget of exactly what the schedule as written costs trains it
step for step.

Each stage's steps are its steps as written x budget / the schedule's cost, rounded down (at least one step), so a
stage ends where it is declared on the schedule and the rounding stays inside the stage that made it. The clock is
piecewise linear, with a breakpoint at each stage's end; the resolved config holds it as `train.budget_clock =
((run step, schedule step, budget spent), ...)`, (0, 0, 0.0) first and (the run's num_steps, the schedule's length,
the share spent, at most 1) last. Every schedule reads it from there, in one place each (the learning rate:
optimizer.py; the stages: stages.py), and a config without it runs on steps as before.
"""
from __future__ import annotations

import bisect
import dataclasses

import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class BudgetClock:
    run_steps: tuple[int, ...]  # breakpoints, ascending from 0: the run's steps at the stages' ends
    schedule_steps: tuple[int, ...]  # the schedule's steps there, ascending from 0
    spent: tuple[float, ...]  # the share of the budget spent there, from 0.0

    @classmethod
    def of(cls, train_cfg) -> "BudgetClock | None":
        """The clock `train_cfg.budget_clock` holds, or None (no budget, or not resolved yet: steps as written)."""
        points = train_cfg.get("budget_clock", ()) or ()
        if not points:
            return None
        if any(len(point) != 3 for point in points):
            raise ValueError(f"config.train.budget_clock={points!r} must be (run step, schedule step, budget spent) "
                             "triples: it is resolved from config.train.budget, not set by hand")
        run, schedule, spent = zip(*((int(r), int(s), float(f)) for r, s, f in points))
        if run[0] != 0 or schedule[0] != 0 or any(b <= a for a, b in zip(run, run[1:])) or any(
                b <= a for a, b in zip(schedule, schedule[1:])):
            raise ValueError(f"config.train.budget_clock={points!r} must start at (0, 0, 0.0), its steps ascending: "
                             "it is resolved from config.train.budget, not set by hand")
        if run[-1] != train_cfg.num_steps:
            raise ValueError(f"config.train.budget_clock ends at run step {run[-1]}, not at config.train.num_steps="
                             f"{train_cfg.num_steps}: it is resolved from config.train.budget, not set by hand")
        return cls(run, schedule, spent)

    @property
    def schedule_length(self) -> int:
        """train.num_steps as written: the schedule's last step."""
        return self.schedule_steps[-1]

    def schedule_step(self, step):
        """The schedule's step (a float, traceable) at run step `step` (an int, or a traced count)."""
        return jnp.interp(jnp.asarray(step, jnp.float32), jnp.asarray(self.run_steps, jnp.float32),
                          jnp.asarray(self.schedule_steps, jnp.float32))

    def fraction(self, step: int) -> float:
        """The share of the budget spent after run step `step` (host side, for logs)."""
        return float(np.interp(step, self.run_steps, self.spent))

    def run_step(self, schedule_step: int) -> int:
        """The run step at which the schedule reaches `schedule_step`: exact at a breakpoint (a stage's end), else
        the first run step at or past it."""
        i = bisect.bisect_left(self.schedule_steps, schedule_step)
        if i < len(self.schedule_steps) and self.schedule_steps[i] == schedule_step:
            return self.run_steps[i]
        i = min(max(i, 1), len(self.schedule_steps) - 1)
        (r0, r1), (s0, s1) = self.run_steps[i - 1:i + 1], self.schedule_steps[i - 1:i + 1]
        return min(r0 + -(-(schedule_step - s0) * (r1 - r0) // (s1 - s0)), self.run_steps[-1])

    def schedule_view(self, config):
        """A copy of `config` (a whole config or its train section) whose train.num_steps is the schedule's length:
        what the schedules and the stage planner read positions against."""
        view = config.copy_and_resolve_references()
        train = view.train if "train" in view else view
        with train.unlocked(), train.ignore_type():  # a clock read back from JSON is a list
            train.num_steps = self.schedule_length
            train.budget_clock = ()
        return view

    def compose(self, schedule):
        """`schedule` (of the schedule's step) as a schedule of the run's optimizer count. optax's count is the step
        before: run step s trains at schedule(s - 1), so the count goes through the clock as run step count + 1."""
        return lambda count: schedule(jnp.maximum(self.schedule_step(count + 1) - 1, 0.0))
