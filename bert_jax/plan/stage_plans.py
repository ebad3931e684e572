"""Every stage of a run planned: each stage's step compiled and judged; the run's verdict is its worst stage's.

A run in stages (config.train.stages, bert_jax/train/stages.py) changes its step's shapes as it goes: BERT-base's
phase 2 at seq 512 needs 4.6x the memory of phase 1 at seq 128 (183 against 39.5 GiB per device at batch 256,
CPU compiler). A plan of the config as written is a plan of stage 0 alone: it said "fits" for a run that runs out
of memory 90 % of the way in. So every stage is compiled and judged, and a verdict names the stage it is about.

A mixture's sources share their stage's sequence length and batch (`data.max_seq_length` is not a key a source may
set: SOURCE_KEYS, data_pipelines/sources/mixture.py), so one step per stage covers every source.

A `StagePlanner` compiles each distinct config once: the stages, the changes that would make a stage fit
(bert_jax/plan/stage_fixes.py) and the run length share its compiles, and so may planners that judge differently
(`cache`).
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os

import ml_collections

from bert_jax.parallel import tpu_slices
from bert_jax.parallel.mesh import batch_shards
from bert_jax.plan import compiled_plan, gpu_cards, memory_fit
from bert_jax.train import perf, stages
from bert_jax.train.config_validation import resolve_config
from bert_jax.train.program import build_program

GIB = 1024**3
DOES_NOT_FIT = "does not fit"
# How bad a verdict is: the run's is its worst stage's. "fits" is the TPU compiler's own (exact) verdict; the
# others are memory_fit's band around the CPU compiler's figure; "" is no verdict (nothing to judge against).
SEVERITY = {"": 0, "fits": 0, "fits with margin": 0, "uncertain": 1, DOES_NOT_FIT: 2}


@dataclasses.dataclass(frozen=True)
class Verdict:
    word: str  # a SEVERITY key
    explanation: str
    needed_bytes: float  # per device: the peak, or for a step the TPU compiler refused, the temporaries it needed
    limit_bytes: float  # the most `needed_bytes` may be for a sure fit (inf: no verdict)

    @property
    def fits(self) -> bool:
        """A sure fit: on the TPU compiler's word, or within the band's highest estimate."""
        return self.word in ("fits", "fits with margin")

    def largest_micro_batch(self, micro_batch: int) -> float:
        """The most sequences per device per micro-batch that can fit, given that `micro_batch` needed what this
        verdict judged: memory c + k * micro with c >= 0 exceeds the limit above micro * limit / needed."""
        return micro_batch * self.limit_bytes / self.needed_bytes


@dataclasses.dataclass(frozen=True)
class Judge:
    """What a device's peak is judged against: a TPU slice's chips or a set of GPUs (bert_jax/plan/gpu_cards.py;
    their own compiler's exact figure against their memory, or hbm_gib), a device kind and its usable memory with
    the band measured around the CPU compiler's figure (bert_jax/plan/memory_fit.py), or nothing: no verdict."""

    tpu_slice: "tpu_slices.TpuSlice | gpu_cards.GpuSet | None" = None  # the accelerator its compiler plans for
    target: memory_fit.Target | None = None
    usable_gib: float = 0.0  # CPU compiler: per device, what a program may use of it; 0 = no verdict
    hbm_gib: float = 0.0  # as given (--hbm_gib); 0 = the chip's or the target's

    @classmethod
    def of(cls, tpu_slice=None, target: str = "", hbm_gib: float = 0.0) -> "Judge":
        if tpu_slice is not None:
            return cls(tpu_slice=tpu_slice, hbm_gib=hbm_gib)
        kind, usable_gib = memory_fit.resolve_target(target, hbm_gib)
        return cls(target=kind, usable_gib=usable_gib, hbm_gib=hbm_gib)

    @property
    def judges(self) -> bool:
        return self.tpu_slice is not None or self.usable_gib > 0

    @property
    def unit(self) -> str:
        return "chip" if self.tpu_slice is not None and not isinstance(self.tpu_slice, gpu_cards.GpuSet) else "device"

    @property
    def device(self) -> str:
        if self.tpu_slice is not None:
            return self.tpu_slice.label
        name = self.target.name if self.target else "a device"
        return f"{name} ({self.usable_gib:.3g} GiB usable)"

    def verdict(self, plan: compiled_plan.Plan) -> Verdict:
        if self.tpu_slice is not None:
            ok, usable = compiled_plan.fits(plan, self.hbm_gib)
            gap = (f"{(usable - plan.peak_bytes) / GIB:.2f} GiB free" if ok
                   else f"{(plan.peak_bytes - usable) / GIB:.2f} GiB over")
            return Verdict("fits" if ok else DOES_NOT_FIT, f"{plan.peak_bytes / GIB:.2f} GiB per {self.unit} of "
                           f"{usable / GIB:.3g} GiB ({gap}; {compiled_plan.compiler_name(self.tpu_slice)}'s own "
                           "figure)", plan.peak_bytes, usable)
        if not self.usable_gib:
            return Verdict("", "", plan.peak_bytes, math.inf)
        fit = memory_fit.judge(plan.peak_bytes, self.usable_gib, self.target, planned_on=plan.compiler)
        return Verdict(fit.verdict, fit.explanation, plan.peak_bytes, fit.usable_bytes / fit.margin.high)

    @staticmethod
    def refusal(refused: compiled_plan.DoesNotFit) -> Verdict:
        explanation = str(refused).removeprefix(f"{DOES_NOT_FIT}: ")
        return Verdict(DOES_NOT_FIT, explanation, refused.needed_gib * GIB, refused.available_gib * GIB)


@dataclasses.dataclass(frozen=True)
class Step:
    """One config's train step, compiled for the target and judged."""

    config: ml_collections.ConfigDict  # resolved
    plan: compiled_plan.Plan | None  # None: the TPU compiler refused it for memory (verdict.explanation says so)
    verdict: Verdict
    formula_flops: float  # whole step (bert_jax/train/perf.py)
    param_count: int
    shards: int  # devices the batch is split over (data x fsdp: tensor splits within a sequence)

    @property
    def per_device(self) -> int:
        """Sequences one device trains per step."""
        return self.config.train.global_batch_size // self.shards

    @property
    def micro_batch(self) -> int:
        """Sequences one device runs per forward and backward: per_device / grad_accum_steps."""
        return self.per_device // self.config.train.grad_accum_steps


@dataclasses.dataclass(frozen=True)
class StagePlan:
    stage: stages.Stage
    step: Step

    @property
    def label(self) -> str:
        s, c = self.stage, self.step.config
        return (f"stage {s.index} (steps {s.start + 1:,}-{s.end:,}, seq {c.data.max_seq_length}, "
                f"batch {c.train.global_batch_size})")


def step_config(config) -> ml_collections.ConfigDict:
    """A stage's config as its step sees it: every `auto` resolved, and no stages (a step is one stage's; each
    stage is checked, for the target's platform, as its own step is compiled)."""
    config = resolve_config(config)
    stages.without_stages(config)
    return config


def _key(config) -> str:
    return config.to_json_best_effort(sort_keys=True)


class StagePlanner:
    """Plans configs for one target, each distinct config compiled once (`cache` may be shared with a planner that
    judges differently: it holds compiles, not verdicts).

    Stages that differ only in how many micro-batches they accumulate (a batch ramp with `accumulate`, Cramming's 9
    stages) run one micro-batch's layers a different number of times. Each stage's own step is still compiled, once:
    its memory is the compiler's for that program (the TPU compiler's temporaries moved by 4 % between 2 and 4
    micro-batches of configs/crammed.py:tiny), and its bytes and collectives count its loop's trips. The compiles
    that count a scanned layer's FLOPs (more unrolled steps) run once, on the micro-batch's step, and every stage
    reuses that count (`_micro_batch_per_layer`): 10 compiles for Cramming's ramp where there were 18."""

    def __init__(self, judge: Judge, cache: dict | None = None):
        self.judge = judge
        # (compiler target, config JSON) -> (plan or DoesNotFit, formula FLOPs, parameters, shards)
        self.cache = {} if cache is None else cache
        # (compiler target, config JSON) -> one scanned layer's FLOPs per loop length, from counting that step
        self.per_layer: dict = {}

    def _target(self) -> str:
        return self.judge.tpu_slice.label if self.judge.tpu_slice else "cpu"

    def step(self, config, count_flops: bool = False) -> Step:
        """config's step, compiled unless it was. count_flops: a fitting TPU step gets every loop's FLOPs counted
        (bert_jax/plan/compiled_plan.py, more compiles): what its roofline needs; memory does not."""
        config = step_config(config)
        key = (self._target(), _key(config))
        if key not in self.cache:
            self.cache[key] = self._compile(config)
        plan, flops, params, shards = self.cache[key]
        if isinstance(plan, compiled_plan.DoesNotFit):
            return Step(config, None, self.judge.refusal(plan), flops, params, shards)
        verdict = self.judge.verdict(plan)
        if count_flops and verdict.fits and compiled_plan.counting_needed(plan, config):
            try:
                plan, self.per_layer[key] = compiled_plan.count_every_layer(
                    plan, config, self.per_layer.get(key) or self._micro_batch_per_layer(config))
            except compiled_plan.DoesNotFit as e:  # the step fits; a variant compiled only to count FLOPs did not
                plan = dataclasses.replace(plan, layers_counted=f"FLOPs count each loop's body once (too low): the "
                                           f"compile that counts every layer was refused for memory ({e})")
            self.cache[key] = (plan, flops, params, shards)
        return Step(config, plan, verdict, flops, params, shards)

    def _micro_batch_per_layer(self, config) -> tuple | None:
        """One scanned layer's FLOPs per loop length of `config`'s micro-batch, counted once on the step that trains
        one micro-batch without accumulation (compiled and counted unless it was): every stage of a ramp by
        accumulation runs that micro-batch, so each reuses the count instead of compiling its own more unrolled
        steps. None for a step without accumulation (it counts its own)."""
        accum = config.train.grad_accum_steps
        if accum == 1:
            return None
        micro = config.copy_and_resolve_references()
        with micro.unlocked():
            micro.train.global_batch_size, micro.train.grad_accum_steps = config.train.global_batch_size // accum, 1
        counted = self.step(micro, count_flops=True)
        return self.per_layer.get((self._target(), _key(counted.config)))

    def _compile(self, config):
        tpu_slice = self.judge.tpu_slice
        try:
            plan = compiled_plan.make_plan(config, tpu_slice, count_every_layer=False)
        except compiled_plan.DoesNotFit as refused:  # the TPU compiler's: no memory analysis, only what it needed
            mesh = compiled_plan.tpu_mesh(config, tpu_slice)
            program = build_program(config, mesh)  # abstract: the formula's FLOPs and the parameters need no compile
            return (refused, perf.step_flops(program, config), perf.count_params(program.abstract_state.params),
                    batch_shards(mesh.shape))
        return (plan, plan.formula_flops, plan.param_count,
                batch_shards(plan.mesh_shape))

    def _compile_ahead(self, configs: list) -> None:
        """Compiles the configs not yet cached side by side, a thread each up to the host's cores: XLA's TPU
        compiler runs a compile on one core, and a ramp's stages are distinct programs (each its batch's shape and
        its loop's trips), so Cramming's 9 stages took 9 compiles one after another. A config that fails here is
        left uncached: the caller compiles it again in order, where its error is raised naming its stage."""
        todo = {}
        for config in configs:
            config = step_config(config)
            todo.setdefault((self._target(), _key(config)), config)
        todo = {key: config for key, config in todo.items() if key not in self.cache}
        if len(todo) < 2:
            return

        def compile_or_none(config):
            try:
                return self._compile(config)
            except Exception:  # noqa: BLE001 -- not lost: the stage is compiled again in order, and raises there
                return None

        with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
            for key, result in zip(todo, pool.map(compile_or_none, todo.values())):
                if result is not None:
                    self.cache[key] = result

    def stages(self, config) -> list[StagePlan]:
        """Every stage of config's run (bert_jax/train/stages.py), stage 0 first, each compiled and judged; a stage's
        config the run would refuse fails naming the stage, as the run's own check does."""
        out = []
        planned = list(stages.plan(config))  # a bad declaration fails here, naming the stage and key
        try:
            self._compile_ahead([stage.config for stage in planned])
        except ValueError:
            pass  # a stage the run would refuse: the loop below names it
        for stage in planned:
            try:
                out.append(StagePlan(stage, self.step(stage.config, count_flops=True)))
            except ValueError as error:
                if not stage.source:
                    raise
                raise type(error)(f"{stage.source} (from step {stage.start}): {error}") from None
        return out


def worst(stage_plans: list[StagePlan]) -> StagePlan:
    """The stage that decides the run's verdict: the worst verdict, and of those the largest need."""
    return max(stage_plans, key=lambda s: (SEVERITY[s.step.verdict.word], s.step.verdict.needed_bytes))
