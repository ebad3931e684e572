"""Stages of one run: sequence length, batch size or masking changing at declared steps, one schedule.

A config declares its stages in `config.train.stages`, each the step it starts at and the keys it
changes from then on (a stage inherits the previous one's changes):

    c.train.num_steps = 1_000_000
    c.train.stages = (dict(start=900_000, data=dict(max_seq_length=512)),)   # BERT: 90 % at 128, 10 % at 512

Two declarations expand into more stages of the same kind, merged with the declared ones by start
(a later stage inherits every earlier change, whichever declaration made it):

- `config.train.batch_size_warmup` (start_batch_size, tokens, max_changes): the global batch grows
  from start_batch_size to `train.global_batch_size` as the run's tokens (batch x the stage's
  `data.max_seq_length`, per step) grow to `tokens`, in at most max_changes steps of change, each
  batch a multiple of the start batch (so it splits over whatever the start batch splits over). The
  batches are start x m_j, m_j = 1 + (k-1)*j//n for j = 0..n (k = global/start, n = min(k-1,
  max_changes)); batch j starts at the first step after which the run has seen tokens x (m_j-1)/(k-1)
  tokens, so the batch follows the line from the start batch (0 tokens) to the full one (`tokens`) from
  below, and the full batch starts once `tokens` are seen. A ramp the run ends before finishing
  stops where the run ends (`show-config` and the loop's stage lines say the batch it reached).
  ModernBERT: 768 -> 4608 sequences over 50B tokens. With `accumulate`, the micro-batch stays
  (start_batch_size / train.grad_accum_steps) and each larger batch accumulates more of them, its stages
  changing `train.grad_accum_steps` too: Cramming's ramp (Geiping & Goldstein 2022, §4.3), which fits
  the memory of the first batch all run long.
- `config.data.mask_rate_schedule` ((step, rate), ...): `data.mask_rate` from each step on (mmBERT's
  30 -> 15 -> 5 %, Ettin's 30 -> 15 %).
- `config.train.objective_switch` (fraction, to): `model.objective` becomes `to` after round(fraction x
  num_steps) steps: a biphasic run's causal phase, then its masked one.

A declared stage may not change the key a declaration drives (train.global_batch_size under a ramp,
data.mask_rate under a schedule): each key has one story.

The run before the first stage's start is stage 0: the config as written, unless a generated change
starts at step 0 (the ramp's start batch, a schedule's step-0 rate), which stage 0 then trains with.
A declared stage starts after step 0. A stage that changes the sequence length or the mask rate
re-derives `data.max_predictions_per_seq` (auto) unless it sets it.
Only STAGE_KEYS may change: what a step's shapes and batches are made of, and the objective (`model.objective`,
e.g. causal LM then MLM: a biphasic run, Gisserot-Boukhlef et al. 2025, arXiv 2507.00994), whose switch the attention
mask and the pipeline's targets follow (`data.objective`, FOLLOWERS) on the same parameters. The learning-rate
schedule, the optimizer and the model's parameters are the run's, so one schedule spans every stage (no jump at a
switch) and the train state carries over unchanged. A shape or objective change recompiles the step.

The loop (bert_jax/train/loop.py) trains each stage as a span of the same run: the checkpoint at a
stage's start holds the state; that stage's data iterator starts fresh there, seeded by
`data_seed` (so a stage does not replay the documents of the stage before in the same order), and
is checkpointed from then on, so a kill anywhere, a switch included, resumes exactly. DONE is
written once, at the last stage's end.
"""
from __future__ import annotations

import dataclasses
import fractions
import math

import ml_collections

from bert_jax.train.budget_clock import BudgetClock
from data_pipelines.loader import masking

# The keys a stage may change, as config paths.
STAGE_KEYS = ("data.max_seq_length", "data.max_predictions_per_seq", "data.masking", "data.mask_rate",
              "train.global_batch_size", "train.grad_accum_steps", "model.objective")

# Keys another key sets wherever it is changed: the pipeline reads the objective through a reference
# (configs/base.py), which a config rebuilt from config.json no longer holds.
FOLLOWERS = {"model.objective": ("data.objective",)}

# A stage changing one of these re-derives data.max_predictions_per_seq (auto) unless it sets it itself.
RESHAPING = {"data.max_seq_length", "data.mask_rate"}


@dataclasses.dataclass(frozen=True)
class Stage:
    index: int
    start: int  # the last step of the stage before (0 for stage 0); this stage runs steps start+1 .. end
    end: int
    config: ml_collections.ConfigDict  # the run's config with this stage's changes applied
    changes: dict  # {config path: value}, every stage's up to this one
    # What starts this stage, for messages: "config.train.stages[0]", "config.train.batch_size_warmup",
    # "config.data.mask_rate_schedule[1]", joined by " and " when several start at one step; "" for a plain stage 0.
    source: str = ""
    declared: int | None = None  # the index in config.train.stages of the declared stage starting here, if one does


WARMUP = "config.train.batch_size_warmup"
MASK_SCHEDULE = "config.data.mask_rate_schedule"
OBJECTIVE_SWITCH = "config.train.objective_switch"


def flat(tree, prefix="") -> dict:
    """{"a.b": value} of a nested config or dict."""
    out = {}
    for key, value in (tree.items() if hasattr(tree, "items") else ()):
        if hasattr(value, "items"):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def declared(config) -> list[tuple[int, dict]]:
    """[(start, {config path: value})] of config.train.stages, checked: ValueError naming the stage and key."""
    stages = config.train.stages
    driven = {"train.global_batch_size": WARMUP if _warmup_on(config) else "",
              "train.grad_accum_steps": WARMUP if _warmup_on(config) and _accumulates(config) else "",
              "data.mask_rate": MASK_SCHEDULE if config.data.get("mask_rate_schedule", ()) else "",
              "model.objective": OBJECTIVE_SWITCH if objective_switch(config) else ""}
    out, previous = [], 0
    for i, stage in enumerate(stages):
        changes = flat(stage)
        if "start" not in changes:
            raise ValueError(f"config.train.stages[{i}] has no `start` (the step it begins after)")
        start = changes.pop("start")
        if not isinstance(start, int) or not previous < start < config.train.num_steps:
            raise ValueError(f"config.train.stages[{i}].start={start!r} must be an int in ({previous}, "
                             f"config.train.num_steps={config.train.num_steps}), after the stage before")
        unknown = sorted(set(changes) - set(STAGE_KEYS))
        if unknown:
            raise ValueError(f"config.train.stages[{i}] changes {', '.join(unknown)}; a stage may change only "
                             f"{', '.join(STAGE_KEYS)} (one schedule, optimizer and model span the run)")
        for key, declaration in driven.items():
            if declaration and key in changes:
                raise ValueError(f"config.train.stages[{i}] changes {key}, which {declaration} drives: set one")
        out.append((start, changes))
        previous = start
    return out


def _warmup_on(config) -> bool:
    warmup = config.train.get("batch_size_warmup")
    return bool(warmup) and warmup.get("start_batch_size", 0) != 0


def _accumulates(config) -> bool:
    """config.train.batch_size_warmup.accumulate, checked: the ramp grows the accumulation, not the micro-batch."""
    accumulate = config.train.batch_size_warmup.get("accumulate", False)
    if not isinstance(accumulate, bool):
        raise ValueError(f"{WARMUP}.accumulate={accumulate!r} must be True (the micro-batch stays, the accumulation "
                         f"grows) or False (the accumulation stays, the micro-batch grows)")
    return accumulate


def ramp_changes(config, batch: int) -> dict:
    """{config path: value} of the ramp's stage training `batch`: the batch, and under `accumulate` the
    accumulation that keeps the first stage's micro-batch (start_batch_size / train.grad_accum_steps)."""
    if not _accumulates(config):
        return {"train.global_batch_size": batch}
    first, accum = config.train.batch_size_warmup.start_batch_size, config.train.grad_accum_steps
    if accum < 1 or first % accum:
        raise ValueError(f"{WARMUP}.start_batch_size={first} with accumulate=True must be a multiple of "
                         f"config.train.grad_accum_steps={accum}: their quotient is the micro-batch every stage keeps")
    return {"train.global_batch_size": batch, "train.grad_accum_steps": batch // (first // accum)}


def batch_ramp(config, declared_stages: list[tuple[int, dict]]) -> list[tuple[int, int]]:
    """[(start, global batch)] of config.train.batch_size_warmup, (0, its start batch) first; [] when off.

    Tokens per step are the batch in force times the sequence length in force (declared stages may change it);
    a batch whose threshold the run does not reach before config.train.num_steps is not in the list."""
    if not _warmup_on(config):
        return []
    warmup, final, num_steps = config.train.batch_size_warmup, config.train.global_batch_size, config.train.num_steps
    first, tokens, max_changes = warmup.start_batch_size, warmup.get("tokens", 0), warmup.get("max_changes", 0)
    if not _is_int(first) or first < 0:
        raise ValueError(f"{WARMUP}.start_batch_size={first!r} must be an int >= 0 (0: no warm-up)")
    if final % first:
        raise ValueError(f"{WARMUP}.start_batch_size={first} must divide config.train.global_batch_size={final}")
    if isinstance(tokens, bool) or not isinstance(tokens, (int, float)) or not 0 < tokens < float("inf"):
        raise ValueError(f"{WARMUP}.tokens={tokens!r} must be > 0: the tokens over which the batch grows to "
                         f"config.train.global_batch_size")
    if not _is_int(max_changes) or max_changes < 1:
        raise ValueError(f"{WARMUP}.max_changes={max_changes!r} must be an int >= 1")
    k = final // first
    if k == 1:
        return []  # the start batch is the batch: nothing to ramp
    n = min(k - 1, max_changes)
    multiples = [1 + (k - 1) * j // n for j in range(n + 1)]
    lengths = [(0, config.data.max_seq_length)] + [(s, c["data.max_seq_length"]) for s, c in declared_stages
                                                   if "data.max_seq_length" in c]
    out, step, seen, batch = [(0, first)], 0, fractions.Fraction(0), first
    for m in multiples[1:]:
        threshold = fractions.Fraction(tokens) * (m - 1) / (k - 1)
        while True:  # through the spans of one sequence length, to the one the threshold is crossed in
            length = [value for s, value in lengths if s <= step][-1]
            until = next((s for s, _ in lengths if s > step), num_steps)
            needed = max(0, math.ceil((threshold - seen) / (batch * length)))
            if step + needed <= until:
                break
            seen += (until - step) * batch * length
            step = until
            if step >= num_steps:
                return out
        step += needed
        seen += needed * batch * length
        if step >= num_steps:
            return out  # the run ends first: it stops ramping at the batch it reached
        batch = first * m
        out = [*out[:-1]] if out[-1][0] == step else out  # two batches due at one step: the larger one
        out.append((step, batch))
    return out


def mask_schedule(config) -> list[tuple[int, float]]:
    """[(step, rate)] of config.data.mask_rate_schedule, checked: ValueError naming the entry."""
    out, num_steps = [], config.train.num_steps
    for i, entry in enumerate(config.data.get("mask_rate_schedule", ())):
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise ValueError(f"{MASK_SCHEDULE}[{i}]={entry!r} must be a (step, rate) pair")
        step, rate = entry
        after = out[-1][0] + 1 if out else 0
        if not _is_int(step) or not after <= step < num_steps:
            raise ValueError(f"{MASK_SCHEDULE}[{i}] step {step!r} must be an int in [{after}, "
                             f"config.train.num_steps={num_steps}): steps ascending, each inside the run")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < 1:
            raise ValueError(f"{MASK_SCHEDULE}[{i}] rate {rate!r} must be in (0, 1)")
        out.append((step, float(rate)))
    return out


def objective_switch(config) -> list[tuple[int, str]]:
    """[(step, objective)] of config.train.objective_switch, checked; [] when off (fraction 0)."""
    switch = config.train.get("objective_switch")
    fraction = switch.get("fraction", 0.0) if switch else 0.0
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ValueError(f"{OBJECTIVE_SWITCH}.fraction={fraction!r} must be in [0, 1): the share of "
                         f"config.train.num_steps before the switch (0: no switch)")
    if not fraction:
        return []
    step, to = round(fraction * config.train.num_steps), switch.get("to", "")
    if not 0 < step < config.train.num_steps:
        raise ValueError(f"{OBJECTIVE_SWITCH}.fraction={fraction} puts the switch at step {step}, outside the run "
                         f"(config.train.num_steps={config.train.num_steps})")
    if not to:
        raise ValueError(f"{OBJECTIVE_SWITCH}.to='' must name the objective trained after the switch "
                         f"(config.model.objective's values: 'mlm', 'clm', ...)")
    return [(step, to)]


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def plan(config) -> list[Stage]:
    """Every stage of the run, stage 0 first; a config without stages is one stage. Under a budget
    (config.train.budget_clock, bert_jax/train/budget_clock.py) the stages are declared on the schedule as written
    and start and end at the run steps where the budget's clock reaches them."""
    clock = BudgetClock.of(config.train)
    if clock is not None:
        return [dataclasses.replace(s, start=clock.run_step(s.start), end=clock.run_step(s.end),
                                    config=stage_config(config, s.changes)) for s in plan(clock.schedule_view(config))]
    declared_stages = declared(config)
    generated = [(start, ramp_changes(config, batch), WARMUP) for start, batch in batch_ramp(config, declared_stages)]
    generated += [(step, {"data.mask_rate": rate}, f"{MASK_SCHEDULE}[{i}]") for i, (step, rate) in
                  enumerate(mask_schedule(config))]
    generated += [(step, {"model.objective": to}, OBJECTIVE_SWITCH) for step, to in objective_switch(config)]
    by_start: dict[int, list] = {0: [{}, [], None]}  # start -> [changes, sources, declared index]
    for i, (start, stage_changes) in enumerate(declared_stages):
        by_start[start] = [dict(stage_changes), [f"config.train.stages[{i}]"], i]
    for start, stage_changes, source in generated:  # their keys are ones no declared stage changes
        entry = by_start.setdefault(start, [{}, [], None])
        entry[0].update(stage_changes)
        entry[1].append(source)
    starts = sorted(by_start)
    ends = starts[1:] + [config.train.num_steps]
    stages, changes = [], {}
    for index, (start, end) in enumerate(zip(starts, ends)):
        stage_changes, sources, declared_index = by_start[start]
        if RESHAPING & stage_changes.keys() and "data.max_predictions_per_seq" not in stage_changes:
            stage_changes["data.max_predictions_per_seq"] = "auto"  # re-derived for the stage's length and rate
        changes = {**changes, **stage_changes}
        stages.append(Stage(index, start, end, stage_config(config, changes), dict(changes), " and ".join(sources),
                            declared_index))
    return stages


def stage_at(config, step: int) -> Stage:
    """The stage that trained step `step` (stage 0 for step 0; the last stage past the run's end): what an export
    of that step's checkpoint is (its objective decides the Hugging Face class)."""
    planned = plan(config)
    return next((stage for stage in planned if step <= stage.end), planned[-1])


def without_stages(config) -> None:
    """Clears config's stage declarations in place: a stage's config, trained or compiled as one step."""
    with config.unlocked():
        config.train.stages = ()
        if "batch_size_warmup" in config.train:
            config.train.batch_size_warmup.start_batch_size = 0
        if "mask_rate_schedule" in config.data:
            config.data.mask_rate_schedule = ()
        if "objective_switch" in config.train:
            config.train.objective_switch.fraction = 0.0


def stage_config(config, changes: dict) -> ml_collections.ConfigDict:
    """A copy of `config` with `changes` ({config path: value}) applied, its max_predictions_per_seq=auto the
    number it derives for the stage's length and rate: the config that stage trains with."""
    staged = config.copy_and_resolve_references()
    changes = {**changes, **{follower: value for key, value in changes.items() for follower in FOLLOWERS.get(key, ())}}
    with staged.unlocked():
        for key, value in changes.items():
            *parents, leaf = key.split(".")
            node = staged
            for parent in parents:
                node = node[parent]
            if leaf in node and type(node[leaf]) is not type(value):  # auto <-> a number: a str field once copied
                del node[leaf]
            node[leaf] = value
        if staged.data.max_predictions_per_seq == masking.AUTO:
            value = masking.max_predictions(staged.data)
            del staged.data["max_predictions_per_seq"]  # a str field once copied
            staged.data.max_predictions_per_seq = value
    return staged


def data_seed(seed: int, index: int) -> int:
    """The data iterator's seed in stage `index`: the run's seed in stage 0, another stream in each later one."""
    return seed if index == 0 else seed + 1_000_003 * index
