"""What would make a stage that does not fit fit: each change compiled, so what is said to fit does.

Three kinds of change, the one that costs the run least first:

- A smaller micro-batch for that stage alone: its `grad_accum_steps`. The global batch stays, and so does training
  (losses and weights are summed over micro-batches before dividing, bert_jax/train/step.py); steps only run
  longer. Which micro-batch can fit is derived from what the stage's own compile measured, without compiling
  more: memory is c + k * micro with c >= 0 (parameters and optimizer state do not shrink with the batch), so m
  sequences that needed N of the L bytes a device may use rule out every micro-batch above m * L / N. The
  largest micro-batch under that bound that divides the per-device batch is compiled to confirm it, each compile
  tightening the bound, at most ACCUMULATION_COMPILES times. That bound is also the per-device batch a change of
  devices or of global batch must reach.
- FSDP (config.mesh.shape (1, -1, tensor)), where several devices each hold the whole parameters and optimizer
  state: it splits them. A mesh is the whole run's.
- A remat policy that keeps fewer activations (bert_jax/models/transformer.py), at the stage's own micro-batch,
  least recomputation first. The compiler does not order policies by memory (bert_jax/plan/plan_search.py), so
  each is compiled. The model, and so its remat policy, is the whole run's.

`plan --search` (TPU) ranks every combination by step time instead; these are the single changes that fit.
"""
from __future__ import annotations

import dataclasses

import jax

from bert_jax.plan import plan_search
from bert_jax.plan.stage_plans import GIB, StagePlan, StagePlanner, Step

ACCUMULATION_COMPILES = 3
# The policies that may keep fewer activations than a given one, least recomputation first.
SAVING_MORE = {"none": ("dots", "full"), "dots": ("full",), "dots_no_batch": ("full",), "full": ()}


@dataclasses.dataclass(frozen=True)
class Fix:
    change: str  # how to make it: flags, or the stage's entry in config.train.stages
    scope: str  # "stage 1" | "the whole run"
    step: Step  # the step with the change, compiled and judged: it fits


@dataclasses.dataclass(frozen=True)
class Fixes:
    found: list[Fix]
    largest_micro_batch: int  # per device, what can fit at most (from the compiles above); 0: not even one sequence
    tried: list[str]  # changes compiled that did not fit, each with its need


def fixes(planner: StagePlanner, stage_plan: StagePlan, later_stages: bool) -> Fixes:
    """The changes that make `stage_plan` fit (a stage of a run that has stages after it when later_stages)."""
    found, tried = [], []
    accumulation, bound = _accumulation(planner, stage_plan, later_stages, tried)
    found += [accumulation] if accumulation else []
    step = stage_plan.step
    tensor = step.config.mesh.shape[2]
    if step.shards > 1 and plan_search.mesh_name(step.config) == "dp":
        overrides = {"mesh.shape": (1, -1, tensor), "mesh.rules": "fsdp_tp"}  # fsdp_tp maps embed to fsdp
        change = f"--config.mesh.shape='{overrides['mesh.shape']}'".replace(" ", "") + (
            "" if step.config.mesh.get("rules") == "fsdp_tp" else " --config.mesh.rules=fsdp_tp")
        found += _confirmed(planner, step, overrides, change, "the whole run", tried)
    for policy in SAVING_MORE.get(step.config.model.remat_policy, ()):
        fix = _confirmed(planner, step, {"model.remat_policy": policy}, f"--config.model.remat_policy={policy}",
                         "the whole run", tried)
        if fix:
            found += fix
            break
    return Fixes(found, int(bound), tried)


def _accumulation(planner, stage_plan, later_stages, tried) -> tuple[Fix | None, float]:
    """(the largest micro-batch that fits through the stage's grad_accum_steps, or None; the bound on it)."""
    step = stage_plan.step
    bound = step.verdict.largest_micro_batch(step.micro_batch)
    compiles = 0
    for micro in sorted((m for m in _divisors(step.per_device) if m < step.micro_batch), reverse=True):
        if micro > bound:
            continue
        if compiles == ACCUMULATION_COMPILES:
            break
        accum = step.per_device // micro
        change = _accumulation_change(stage_plan, accum, later_stages)
        candidate = _compiled(planner, step, {"train.grad_accum_steps": accum}, change, tried)
        compiles += 1
        if candidate is None:
            continue  # the compiler failed on this one (out of on-chip vmem, say): says nothing of memory
        if candidate.verdict.fits:
            return Fix(change, f"stage {stage_plan.stage.index}", candidate), bound
        tried.append(f"grad_accum_steps={accum} ({micro} per {planner.judge.unit}): {_need(candidate)}")
        bound = min(bound, candidate.verdict.largest_micro_batch(micro))
    return None, bound


def _accumulation_change(stage_plan: StagePlan, accum: int, later_stages: bool) -> str:
    index = stage_plan.stage.index
    if index == 0:
        every = " (every stage that does not set its own)" if later_stages else ""
        return f"--config.train.grad_accum_steps={accum}{every}"
    if stage_plan.stage.declared is not None:
        return f"train=dict(grad_accum_steps={accum}) in config.train.stages[{stage_plan.stage.declared}]"
    return (f"dict(start={stage_plan.stage.start}, train=dict(grad_accum_steps={accum})) in config.train.stages "
            f"(where {stage_plan.stage.source} starts stage {index})")


def _confirmed(planner, step: Step, overrides: dict, change: str, scope: str, tried: list) -> list[Fix]:
    candidate = _compiled(planner, step, overrides, change, tried)
    if candidate is None:
        return []
    if candidate.verdict.fits:
        return [Fix(change, scope, candidate)]
    tried.append(f"{change}: {_need(candidate)}")
    return []


def _compiled(planner, step: Step, overrides: dict, change: str, tried: list) -> Step | None:
    """step with overrides, compiled and judged; None (and why, in `tried`) where the change cannot be built or
    compiled: a mesh the model does not split over, or the TPU compiler out of on-chip vmem, as plan_search's
    candidates."""
    try:
        return planner.step(_with(step.config, overrides))
    except (ValueError, jax.errors.JaxRuntimeError) as e:
        tried.append(f"{change}: {str(e).strip().splitlines()[0][:200]}")
        return None


def _need(step: Step) -> str:
    v = step.verdict
    what = "temporaries alone need" if step.plan is None else "peak"
    return f"{what} {v.needed_bytes / GIB:.2f} GiB, {v.word}"


def _with(config, overrides: dict):
    return plan_search.with_overrides(config, overrides)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def describe(fixes_: Fixes, stage_plan: StagePlan, unit: str = "device") -> list[str]:
    """Markdown bullets: each change that fits, then the per-device batch that can, and what did not fit (`unit`:
    "chip" for a TPU slice)."""
    step = stage_plan.step
    lines = []
    for fix in fixes_.found:
        s = fix.step
        lines.append(f"- `{fix.change}` ({fix.scope}): {s.micro_batch} sequences per {unit} per micro-batch, "
                     f"peak {s.verdict.needed_bytes / GIB:.2f} GiB: **{s.verdict.word}**")
    largest, batch = fixes_.largest_micro_batch, step.config.train.global_batch_size
    if largest >= 1:
        devices = min(d for d in _divisors(batch) if batch // d <= largest)
        lines.append(f"- a smaller per-{unit} batch: at most {largest} sequences per {unit} per micro-batch can fit at "
                     f"these shapes (now {step.micro_batch}): the global batch {batch} over {devices} {unit}s or more, "
                     f"or a global batch of at most {largest * step.shards} over {step.shards} "
                     f"{unit}{'s' if step.shards > 1 else ''}")
    else:
        lines.append(f"- not even one sequence per {unit} per micro-batch can fit at these shapes "
                     f"(seq {step.config.data.max_seq_length}): a {unit} with more memory, or a shorter sequence")
    if fixes_.tried:
        lines.append("- compiled and did not fit: " + "; ".join(fixes_.tried))
    return lines
