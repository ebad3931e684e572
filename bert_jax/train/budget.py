"""`config.train.budget`: a run sized by wall-clock time, tokens or FLOPs instead of a step count.

    --config.train.budget=8m          wall-clock time: a number and s, m, h or d (90s, 8m, 1.5h, 24h, 2d)
    --config.train.budget=2e9tokens   tokens: sequences x max_seq_length per step, padding included
    --config.train.budget=3e18flops   FLOPs: the MFU formula's per step (bert_jax/train/perf.py), whole global batch

The schedule as written stays: `train.num_steps` is its length and every position in it (warmup, decay, WSD,
onecycle, stages, batch and mask-rate ramps) a share of it. The budget buys its own number of steps, and every
schedule runs over the fraction of the budget spent (bert_jax/train/budget_clock.py), as Cramming's do (Geiping &
Goldstein 2022). `resolve` turns the budget into that clock where the config is checked (check_config), before
anything is created: the resolved config's `train.num_steps` is the steps the budget buys, and `train.budget_clock`
maps them onto the schedule. The run ends there as any run ends: saved, evaluated, DONE.

Tokens and FLOPs convert exactly: each stage's steps as written x the budget / what the schedule as written costs
(its steps x their tokens or FLOPs), rounded down (at least one step). A resume resolves the same clock from the same
config, so it continues its budget.

Wall-clock time is not reproducible as such. Its first start calibrates (bert_jax/train/budget_calibration.py): it
times `train.budget_calibration_steps` steps of stage 0 (after the step that compiles) and records the seconds per
step as `train.budget_step_s` in DIR/config.json and config_history.jsonl; the budget is then as many steps as fit at
that speed (a later stage's step scaled by its FLOPs per step against stage 0's). `plan --budget` resolves the same
clock by the same function (`clock_for`), from stage 0's roofline bound on its target instead of a measured speed. A
relaunch of the workdir reads the recorded speed and resolves the same steps, and `--config.train.budget_step_s=S`
fixes it for a new workdir: both are exact. What the budget counts is step time (the loop's: data waits, dispatch, the device); start-up,
compiles, restores, checkpoint saves, evaluation, replayed steps and the time between a kill and its relaunch are
outside it, as the goodput record separates them (`bert-jax inspect --mode=goodput`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import re

import ml_collections

from bert_jax.families import abstract_params_for
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.train import counters, perf, step_keyed
from bert_jax.train import stages as stages_lib

KEY = "config.train.budget"
SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)\s*(s|m|h|d|tokens|flops)\s*$")
ACCEPTED = ("a wall-clock time (90s, 8m, 1.5h, 24h, 2d), a token count (2e9tokens) or a FLOP count (3e18flops): "
            "a number > 0 and its unit")


@dataclasses.dataclass(frozen=True)
class Budget:
    amount: float  # seconds, tokens or FLOPs
    unit: str  # "seconds" | "tokens" | "flops"
    text: str  # as the config wrote it

    def describe(self, amount: float | None = None) -> str:
        amount = self.amount if amount is None else amount
        return {"seconds": f"{amount:,.1f} s", "tokens": f"{amount:.4g} tokens", "flops": f"{amount:.4g} FLOPs"}[
            self.unit]


def parse(text: str, key: str = KEY) -> Budget | None:
    """The budget `text` names, None for "" (no budget: train.num_steps); ValueError naming `key` otherwise."""
    if text in ("", None):
        return None
    match = _BUDGET.match(str(text)) if isinstance(text, str) else None
    amount = float(match.group(1)) if match else 0.0
    if not match or not 0 < amount < math.inf:
        raise ValueError(f"{key}={text!r} is not a budget; give {ACCEPTED}")
    unit = match.group(2)
    if unit in SECONDS:
        return Budget(amount * SECONDS[unit], "seconds", text)
    return Budget(amount, unit, text)


def step_cost(config, unit: str) -> float:
    """What one step of `config` (a stage's) costs: tokens, or the formula's FLOPs of the model's train step."""
    if unit == "tokens":
        return float(counters.tokens_per_step(config))
    return perf.train_flops_per_step(_abstract_params(config.model.to_json_best_effort(sort_keys=True)), config.model,
                                     config.data, config.train.global_batch_size)


@functools.lru_cache(maxsize=4)
def _abstract_params(model_json: str):
    """The model's parameter shapes, traced once for every stage (a stage never changes the model)."""
    return abstract_params_for(ml_collections.ConfigDict(json.loads(model_json)))


def resolve(config, workdir: str | None = None) -> tuple[ml_collections.ConfigDict, list[str]]:
    """(`config` with its budget resolved into train.num_steps and train.budget_clock, lines saying how).

    Unchanged without a budget, when already resolved (a recorded config), and for a wall-clock budget whose speed
    is not known yet (neither set, nor recorded in `workdir`'s config.json): the run's first start calibrates it."""
    budget = parse(config.train.get("budget", ""))
    if budget is None or config.train.get("budget_clock", ()):
        return config, []
    _check_schedules_follow(config)
    step_s = config.train.get("budget_step_s", 0.0)
    if not isinstance(step_s, (int, float)) or step_s < 0:
        raise ValueError(f"config.train.budget_step_s={step_s!r} must be >= 0 (0: measured at the run's first start)")
    recorded = ""
    if budget.unit == "seconds" and not step_s and workdir:
        step_s = recorded_step_s(workdir, budget.text)
        recorded = ", as the run measured at its first start" if step_s else ""
    if budget.unit == "seconds" and not step_s:
        return config, [f"{KEY}={budget.text}: the steps it buys are measured at the run's first start "
                        f"(config.train.budget_calibration_steps={config.train.budget_calibration_steps} timed steps "
                        f"of stage 0), then recorded as config.train.budget_step_s"]
    clock = clock_for(stages_lib.plan(config), budget, step_s)
    resolved = config.copy_and_resolve_references()
    with resolved.unlocked(), resolved.train.ignore_type():
        resolved.train.budget_step_s = float(step_s)
        resolved.train.num_steps = clock[-1][0]
        resolved.train.budget_clock = clock
    speed = f" at {step_s:.4g} s per step of stage 0{recorded}" if budget.unit == "seconds" else ""
    return resolved, [f"{KEY}={budget.text} -> config.train.num_steps={clock[-1][0]:,} ({budget.describe()}"
                      f"{speed}); the schedule as written ({config.train.num_steps:,} steps) runs over the fraction "
                      f"of the budget spent (config.train.budget_clock)"]


def clock_for(stages: list, budget: Budget, step_s: float = 0.0) -> tuple:
    """The budget's clock over `stages` (bert_jax/train/stages.py plan of the schedule as written): what `resolve`
    records for the run and what `plan --budget` prints (bert_jax/plan/budget_plan.py), the one resolution of a
    budget. A wall-clock budget needs `step_s`, stage 0's seconds per step: the run's measured (or recorded) speed,
    the plan's roofline bound for stage 0 on its target; a later stage's is scaled by its FLOPs per step (stage_costs)
    in both."""
    if budget.unit == "seconds" and not step_s > 0:
        raise ValueError(f"{budget.text} is wall-clock time: resolving it needs stage 0's seconds per step")
    return budget_clock(stages, stage_costs(stages, budget.unit, step_s), budget.amount)


def stage_costs(stages: list, unit: str, step_s: float = 0.0) -> list[float]:
    """Each stage's cost per step: tokens, FLOPs, or seconds (stage 0's `step_s`, a later stage's scaled by its
    FLOPs per step against stage 0's: one speed in FLOP/s for the whole run)."""
    if unit != "seconds":
        return [step_cost(s.config, unit) for s in stages]
    if len(stages) == 1:
        return [step_s]
    flops = [step_cost(s.config, "flops") for s in stages]
    return [step_s * f / flops[0] for f in flops]


def budget_clock(stages: list, costs: list[float], amount: float) -> tuple:
    """((run step, schedule step, budget spent), ...) at each stage's end: the schedule as written stretched to spend
    `amount`, each stage's steps scaled by amount / what the schedule as written costs (its steps x `costs`),
    rounded down, at least one; `budget spent` the fraction of `amount` spent by then."""
    written = sum((s.end - s.start) * cost for s, cost in zip(stages, costs))
    points, run, spent = [(0, 0, 0.0)], 0, 0.0
    for stage, cost in zip(stages, costs):
        steps = max(1, math.floor((stage.end - stage.start) * amount / written * (1 + 1e-12)))  # whole numbers stay
        run, spent = run + steps, spent + steps * cost
        points.append((run, stage.end, spent / amount))
    return tuple(points)


def _check_schedules_follow(config) -> None:
    """A step-keyed key the clock does not drive (step_keyed.REFUSED) is refused, naming it, rather than left
    switching at its step as written."""
    refused = step_keyed.refused_beside_a_budget(config)
    if refused:
        raise ValueError(f"{KEY}={config.train.budget!r} and {refused}; size the run with config.train.num_steps")


def recorded_step_s(workdir: str, text: str) -> float:
    """The seconds per step `workdir`'s config.json recorded for the same budget; 0.0 if none."""
    config_json = paths.fresh(Workdir(workdir).config_json)
    if not config_json.exists():
        return 0.0
    train = json.loads(config_json.read_text()).get("train", {})
    if train.get("budget") != text:
        return 0.0
    value = train.get("budget_step_s", 0.0)
    return float(value) if isinstance(value, (int, float)) and value > 0 else 0.0


def needs_calibration(config) -> bool:
    """A wall-clock budget whose speed is not known: the run's first start measures it."""
    budget = parse(config.train.get("budget", ""))
    return budget is not None and budget.unit == "seconds" and not config.train.get("budget_clock", ())
