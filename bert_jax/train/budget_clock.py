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
the share spent, at most 1) last: Python ints, exact at any size, as the step counters are (train/counters.py); the
device follows it in uint32 integer arithmetic (`schedule_position`), never through a float32. Every schedule reads it
from there, in one place each (the learning rate:
optimizer.py; the stages: stages.py), and a config without it runs on steps as before.
"""
from __future__ import annotations

import bisect
import dataclasses
import fractions

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

    def schedule_position(self, step):
        """(whole, fraction) of the schedule's step at run step `step` (a uint32 count, traceable): `whole` a uint32,
        exact at any count below 2^32, `fraction` a float32 in [0, 1). Integer arithmetic only: a float32 clock
        rounds the run step from 2^24 (16.8M) on, by 256 steps at 2^32. Past the last breakpoint: the schedule's end.

        On segment i, run step r0 + d is schedule step s0 + d x (s1 - s0) / (r1 - r0) = s0 + d x k + d x rem / den
        (k, rem: the slope's whole part and remainder, over den = r1 - r0), and d x rem / den is a long division by
        den over d's 32 bits, every partial remainder below den: no product ever leaves uint32."""
        step = jnp.asarray(step, jnp.uint32)
        u32 = lambda values: jnp.asarray(np.asarray(values, np.uint32))  # noqa: E731
        r0s, s0s = self.run_steps[:-1], self.schedule_steps[:-1]
        dens = [r1 - r0 for r0, r1 in zip(r0s, self.run_steps[1:])]
        nums = [s1 - s0 for s0, s1 in zip(s0s, self.schedule_steps[1:])]
        segment = jnp.sum(step >= u32(self.run_steps[1:-1])) if len(dens) > 1 else 0  # the last holds what follows
        r0, s0, den = u32(r0s)[segment], u32(s0s)[segment], u32(dens)[segment]
        k, rem = u32([n // d for n, d in zip(nums, dens)])[segment], u32([n % d for n, d in zip(nums, dens)])[segment]
        d = jnp.minimum(jnp.maximum(step, r0), r0 + den) - r0
        whole, left = jnp.zeros([], jnp.uint32), jnp.zeros([], jnp.uint32)  # floor(d x rem / den), its remainder
        if any(n % d for n, d in zip(nums, dens)):  # a slope that is not a whole number
            for bit in range(31, -1, -1):
                over = left >= den - left  # 2 x left >= den
                left, whole = jnp.where(over, left - (den - left), left + left), whole + whole + over
                add = ((d >> bit) & 1) == 1
                over = add & (left >= den - rem)  # left + rem >= den
                left = jnp.where(add, jnp.where(over, left - (den - rem), left + rem), left)
                whole = whole + over
        return s0 + d * k + whole, left.astype(jnp.float32) / den.astype(jnp.float32)

    def schedule_step_exact(self, step: int) -> fractions.Fraction:
        """The schedule's step at run step `step`, as an exact fraction (host side: tests, messages)."""
        i = min(max(bisect.bisect_right(self.run_steps, step), 1), len(self.run_steps) - 1)
        (r0, r1), (s0, s1) = self.run_steps[i - 1:i + 1], self.schedule_steps[i - 1:i + 1]
        return s0 + fractions.Fraction(min(max(step, r0), r1) - r0) * (s1 - s0) / (r1 - r0)

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
        before: run step s trains at schedule(s - 1), so the count goes through the clock as run step count + 1.
        Between two whole schedule steps the value is interpolated linearly: the schedule itself only ever sees
        whole uint32 counts, exact at any size."""
        def at(count):
            whole, fraction = self.schedule_position(jnp.asarray(count, jnp.uint32) + 1)
            fraction = jnp.where(whole >= 1, fraction, 0.0)  # before schedule step 1: its count 0
            before = jnp.maximum(whole, 1) - 1
            low = schedule(before)
            return jnp.where(fraction > 0, low + fraction * (schedule(before + 1) - low), low)

        return at
