"""Stages of one run: sequence length, batch size or masking changing at declared steps, one schedule.

A config declares its stages in `config.train.stages`, each the step it starts at and the keys it
changes from then on (a stage inherits the previous one's changes):

    c.train.num_steps = 1_000_000
    c.train.stages = (dict(start=900_000, data=dict(max_seq_length=512)),)   # BERT: 90 % at 128, 10 % at 512

The run before the first stage's start is stage 0, the config as written. A stage that changes the
sequence length or the mask rate re-derives `data.max_predictions_per_seq` (auto) unless it sets it.
Only STAGE_KEYS may change: what a step's shapes and batches are made of. The learning-rate schedule, the optimizer
and the model are the run's, so one schedule spans every stage (no jump at a switch) and the
train state carries over unchanged. A shape change recompiles the step.

The loop (bert_jax/train/loop.py) trains each stage as a span of the same run: the checkpoint at a
stage's start holds the state; that stage's data iterator starts fresh there, seeded by
`data_seed` (so a stage does not replay the documents of the stage before in the same order), and
is checkpointed from then on, so a kill anywhere, a switch included, resumes exactly. DONE is
written once, at the last stage's end.
"""
from __future__ import annotations

import dataclasses

import ml_collections

from data_pipelines.loader import masking

# The keys a stage may change, as config paths.
STAGE_KEYS = ("data.max_seq_length", "data.max_predictions_per_seq", "data.masking", "data.mask_rate",
              "train.global_batch_size", "train.grad_accum_steps")

# A stage changing one of these re-derives data.max_predictions_per_seq (auto) unless it sets it itself.
RESHAPING = {"data.max_seq_length", "data.mask_rate"}


@dataclasses.dataclass(frozen=True)
class Stage:
    index: int
    start: int  # the last step of the stage before (0 for stage 0); this stage runs steps start+1 .. end
    end: int
    config: ml_collections.ConfigDict  # the run's config with this stage's changes applied
    changes: dict  # {config path: value}, every stage's up to this one


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
        out.append((start, changes))
        previous = start
    return out


def plan(config) -> list[Stage]:
    """Every stage of the run, stage 0 first; a config without stages is one stage."""
    declared_stages = declared(config)
    starts = [0] + [start for start, _ in declared_stages]
    ends = starts[1:] + [config.train.num_steps]
    stages, changes = [], {}
    for index, (start, end) in enumerate(zip(starts, ends)):
        if index:
            stage_changes = dict(declared_stages[index - 1][1])
            if RESHAPING & stage_changes.keys() and "data.max_predictions_per_seq" not in stage_changes:
                stage_changes["data.max_predictions_per_seq"] = "auto"  # re-derived for the stage's length and rate
            changes = {**changes, **stage_changes}
        stages.append(Stage(index, start, end, stage_config(config, changes), dict(changes)))
    return stages


def stage_config(config, changes: dict) -> ml_collections.ConfigDict:
    """A copy of `config` with `changes` ({config path: value}) applied, its max_predictions_per_seq=auto the
    number it derives for the stage's length and rate: the config that stage trains with."""
    staged = config.copy_and_resolve_references()
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
