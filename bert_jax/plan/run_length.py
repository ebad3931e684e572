"""How long a run takes, at the least: the roofline step time x the steps, per stage, in hours and chip-hours.

`plan --tpu` compiles a config's step for a slice and bounds its time (bert_jax/plan/roofline.py:
its FLOPs at peak or its HBM bytes at bandwidth, whichever is longer). A user about to pay wants
the whole run: config.train.num_steps of that step, or, for a run in stages
(bert_jax/train/stages.py), each stage's steps of its own step (each stage is compiled).

It is a lower bound: the step's collectives are in it (bert_jax/plan/roofline.py), but the input pipeline,
evaluation, checkpoints and compiles all add to it, and a step whose FLOPs the compiler could not count in
full is itself bounded from below (`Plan.step_is_exact`).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class StageLength:
    label: str  # "steps 1-900,000 (seq 128)"
    steps: int
    step_s: float  # the roofline bound of one step
    chips: int
    exact_step: bool = True  # False: step_s itself is a lower bound on the roofline's

    @property
    def hours(self) -> float:
        return self.steps * self.step_s / 3600

    @property
    def chip_hours(self) -> float:
        return self.hours * self.chips


def format_run_length(stages: list[StageLength]) -> str:
    """Markdown lines: each stage's hours and chip-hours, and the run's total, labelled as a lower bound."""
    lines = ["", "**Run length (a lower bound)**: steps x the roofline step time (collectives in it); input, "
             "evaluation and checkpoints add to it.", "", "| stage | steps | step (ms) | hours | chip-hours |", "|---|---|---|---|---|"]
    for s in stages:
        lines.append(f"| {s.label} | {s.steps:,} | {'≥ ' if not s.exact_step else ''}{s.step_s * 1e3:.2f} | "
                     f"≥ {_number(s.hours)} | ≥ {_number(s.chip_hours)} |")
    if len(stages) > 1:
        lines.append(f"| all | {sum(s.steps for s in stages):,} | | ≥ {_number(sum(s.hours for s in stages))} | "
                     f"≥ {_number(sum(s.chip_hours for s in stages))} |")
    return "\n".join(lines)


def _number(value: float) -> str:
    """1,234 / 25.0 / 0.00123: whole above 100, one decimal above 1, three significant digits below."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.3g}"


def stage_label(start: int, end: int, config) -> str:
    return (f"steps {start + 1:,}-{end:,} (seq {config.data.max_seq_length}, "
            f"batch {config.train.global_batch_size})")
