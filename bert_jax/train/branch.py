"""Branches: a new run in a new workdir that starts from another run's checkpoint (`config.branch_from=DIR:STEP`).

Today's recipes (ModernBERT, Ettin, mmBERT) train one long warmup-stable phase and branch off its checkpoints: a
decay, a context extension, decays on other data that are then averaged. A branch takes the parent's parameters,
optimizer state, step counter and data position, so that a branch that changes nothing trains the parent's next
steps bit for bit; what it changes (schedule, data, sequence length, masking, batch, model keys that keep every
parameter's shape) applies from the step after. The parent is only read: its checkpoint is restored into the
branch's first state, and the branch's own checkpoints go to its own workdir.

The config check resolves a branch once, before anything is created (`resolve`), and records the result in the
branch's config.json: the step `last` named, whether the data order goes on (`config.branch.data`), a decay
schedule's start. A resume of the branch restores its own checkpoints like any run's.
"""
from __future__ import annotations

import dataclasses
import json

import jax
import optax
import orbax.checkpoint as ocp
from absl import logging
from grain import checkpoint as grain_checkpoint

import bert_jax
from bert_jax.checkpoint import manager as ckpt
from bert_jax.checkpoint import reference
from bert_jax.checkpoint.params import state_metadata
from bert_jax.families import abstract_params_for
from bert_jax.run import experiment
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir, config_from_json
from bert_jax.train import optimizer
from bert_jax.train import stages as stages_lib

KEY = "config.branch_from"
DATA_CHOICES = ("auto", "continued", "reseeded")
# What a branch's batches are made of: unchanged, the parent's data iterator goes on where it stopped.
DATA_KEYS = ("seed", "data.", "train.global_batch_size", "train.stages", "train.batch_size_warmup")
# A reseeded branch's data seed is the run's seed moved by this times its step + 1 (bert_jax/train/stages.py
# data_seed moves it per stage).
RESEED_OFFSET = 7_919


def parent(config) -> reference.CheckpointRef | None:
    """The checkpoint a branch starts from, as its config recorded it (DIR:STEP, resolved); None for no branch."""
    if not config.branch_from:
        return None
    workdir, step, _ = reference.split(config.branch_from)
    return reference.CheckpointRef(workdir, step)


def first_step(config) -> int:
    """The step the branch's first state is at: the parent's step, or 0 with config.branch.reset_step."""
    ref = parent(config)
    return 0 if ref is None or config.branch.reset_step else ref.step


def reached(config, workdir: str) -> int:
    """The step a start of this run resumes after: its newest checkpoint, else where a branch starts, else 0."""
    steps = Workdir(workdir).checkpoint_steps()
    return steps[-1] if steps else first_step(config)


def resolve(config, workdir: str | None = None) -> tuple:
    """(`config` with its branch resolved, a line per resolved key). Refuses, naming the key: a missing run or step,
    an unfinished write, another family, a key that changes a parameter's shape, a step past the run's end."""
    if config.branch_from is None:  # a branch phase's config (configs/modernbert_base.py:decay) left it to the user
        raise bert_jax.UserError(f"{KEY} is unset: this config is a branch; name the checkpoint it goes on from, "
                                 f"{KEY}=DIR:STEP (STEP a number or last)")
    if not config.branch_from:
        return config, []  # (a decay schedule's `from` keys set by hand are checked by optimizer.py)
    if config.branch.data not in DATA_CHOICES:
        raise bert_jax.UserError(f"config.branch.data={config.branch.data!r}; expected one of "
                                 f"{', '.join(DATA_CHOICES)}")
    # A resume of the branch takes what its first start resolved from its config.json: the parent is not read
    # again (it may have trained on, or be gone), and the restore checks the shapes against the branch's own step.
    recorded = _recorded_config(workdir)
    if recorded is not None and _same_run(recorded.branch_from, config.branch_from):
        ref, before = parent(recorded), None
    else:
        ref = reference.resolve(config.branch_from, KEY, allow_ema=False)
        before = ref.config()
        _check_shapes(before, config, ref)
    lines, resolved = [], config.copy_and_resolve_references()
    with resolved.unlocked():
        if resolved.branch_from != str(ref):
            lines.append(f"config.branch_from={config.branch_from} -> {ref}")
            resolved.branch_from = str(ref)
        start = 0 if resolved.branch.reset_step else ref.step
        if before is None:
            _as_recorded(resolved, recorded, lines)
        same = before is None or _data_view(before) == _data_view(resolved)
        if resolved.branch.data == "auto":
            resolved.branch.data = "continued" if same and not resolved.branch.reset_step else "reseeded"
            lines.append(f"config.branch.data=auto -> {resolved.branch.data} (the data config "
                         f"{'is' if same else 'differs from'} {ref.workdir}'s"
                         f"{', the step reset' if same and resolved.branch.reset_step else ''})")
        elif resolved.branch.data == "continued" and not same:
            raise bert_jax.UserError(f"config.branch.data=continued: the data config differs from {ref.workdir}'s "
                                     f"({', '.join(_changed_data_keys(before, resolved))}); its stream cannot go on")
        elif resolved.branch.data == "continued" and resolved.branch.reset_step:
            raise bert_jax.UserError("config.branch.data=continued with config.branch.reset_step=True: the parent's "
                                     "stream is at its own step; leave config.branch.data=auto (a new order)")
        t = resolved.train
        if getattr(optimizer.SCHEDULES.get(t.schedule), "starts_from_a_parent", False):  # `decay`
            if t.decay_from_step < 0:
                t.decay_from_step = start
                lines.append(f"config.train.decay_from_step=-1 -> {start} (the branch's first state)")
            if t.decay_from_learning_rate < 0:
                rate = float(optimizer.learning_rate_schedule(before.train)(ref.step))
                t.decay_from_learning_rate = rate
                lines.append(f"config.train.decay_from_learning_rate=-1 -> {rate:g} ({ref}'s next rate)")
            if t.decay_steps > 0 and t.num_steps != t.decay_from_step + t.decay_steps:
                lines.append(f"config.train.num_steps={t.num_steps} -> {t.decay_from_step + t.decay_steps} "
                             f"(decay_from_step + decay_steps)")
                t.num_steps = t.decay_from_step + t.decay_steps
            elif t.decay_steps <= 0:
                t.decay_steps = t.num_steps - t.decay_from_step
                lines.append(f"config.train.decay_steps=0 -> {t.decay_steps} (num_steps - decay_from_step)")
        if resolved.train.num_steps <= start:
            raise bert_jax.UserError(f"config.train.num_steps={resolved.train.num_steps} is not past the branch's "
                                     f"step {start} ({KEY}={ref}): nothing would train")
        if before is not None:
            _resolve_iterator_origin(resolved, before, ref.step)
    return resolved, lines


def _as_recorded(resolved, recorded, lines: list[str]) -> None:
    """The keys a branch's first start resolved from its parent, as its config.json recorded them, where `resolved`
    leaves them to be resolved (auto, -1): its data order and how its iterators are built, a decay's start."""
    for key in ("branch.data", "branch.seed_base", "branch.first_step", "train.decay_from_step",
                "train.decay_from_learning_rate"):
        section, name = key.split(".")
        if resolved[section][name] in ("auto", -1, -1.0):
            resolved[section][name] = recorded[section][name]
            lines.append(f"config.{key} -> {recorded[section][name]!r}, as this branch's first start resolved it")


def iterator_origin(config, stage: stages_lib.Stage | None) -> tuple[int, int]:
    """(seed, first step) of the data iterator a stage of this run builds: a stage's own seed (stages.data_seed) and
    start, except in a branch, whose iterators come from the seed base and first step it resolved (`resolve`), so
    that a branch that goes on with its parent's stream builds the parent's iterator and restores its position."""
    index, start = (stage.index, stage.start) if stage else (0, 0)
    if not config.branch_from:
        return stages_lib.data_seed(config.seed, index), start
    first = config.branch.first_step
    inside = start <= first and (stage is None or first < stage.end)
    return stages_lib.data_seed(config.branch.seed_base, index), first if inside else start


def continues_iterator(config, stage: stages_lib.Stage | None) -> bool:
    """Whether the branch's first stage restores the parent's iterator: the data unchanged, and the parent had
    drawn from this stage's stream (at a stage's start the parent, too, began a new one)."""
    return config.branch.data == "continued" and first_step(config) > (stage.start if stage else 0)


def program_for_branch(config, program, iterator):
    """The program with its `init` the branch's first state: the parent's state at its step (the iterator, when
    given, restored in place to the parent's position), with config.branch's resets applied. What the loop hands the
    harness on a branch's first start (a workdir with checkpoints restores its own); the harness calls `init` under
    the mesh, so the state is restored straight onto this run's shards, whatever mesh the parent had."""
    ref = parent(config)

    def init():
        state = _restore(ref, config, program, iterator)
        logging.info("branched from %s%s%s%s", ref, ", optimizer state reset" if config.branch.reset_optimizer
                     else "", ", step counted from 0" if config.branch.reset_step else "",
                     ", the parent's data position" if iterator is not None else ", a new data order")
        return state

    return dataclasses.replace(program, init=init)


def _restore(ref, config, program, iterator):
    """The parent's state, read onto this run's shards. Whole, when the two states hold the same fields; else the
    fields both hold (all but the optimizer state with reset_optimizer), and the rest this run's own: fresh moments,
    and an EMA (config.train.ema_decay) the parent did not keep starting at its parameters."""
    abstract = program.abstract_state
    wanted = [f.name for f in dataclasses.fields(abstract)]
    stored = set(state_metadata(ref.run, ref.step))
    skip = {"opt_state"} if config.branch.reset_optimizer else set()
    whole = not skip and stored == set(wanted)
    fields = [name for name in wanted if name in stored and name not in skip]
    manager = ocp.CheckpointManager(
        paths.absolute(ref.run.checkpoints), options=ocp.CheckpointManagerOptions(create=False),
        item_handlers={ckpt.STATE_ITEM: ocp.StandardCheckpointHandler() if whole else ocp.PyTreeCheckpointHandler(),
                       ckpt.DATA_ITEM: grain_checkpoint.CheckpointHandler()})
    try:
        ckpt.check_compatible(manager, ref.step, abstract.params, prefix="params/")
        if whole:
            items = {ckpt.STATE_ITEM: ocp.args.StandardRestore(abstract)}
        else:
            target = {name: getattr(abstract, name) for name in fields}
            items = {ckpt.STATE_ITEM: ocp.args.PyTreeRestore(
                item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)}
        if iterator is not None:
            items[ckpt.DATA_ITEM] = grain_checkpoint.CheckpointRestore(iterator)
        try:
            restored = manager.restore(ref.step, args=ocp.args.Composite(**items))[ckpt.STATE_ITEM]
        except (ValueError, KeyError, TypeError) as error:
            raise bert_jax.UserError(
                f"{KEY}={ref}: its optimizer state does not fit this config's (config.train.optimizer and its "
                f"keys); set config.branch.reset_optimizer=True for fresh moments ({type(error).__name__})") from None
    finally:
        manager.close()
    if whole:
        state = restored
    else:
        state = program.init().replace(**restored)
        if "ema" in wanted and "ema" not in stored:
            state = state.replace(ema=jax.tree.map(jax.numpy.copy, state.params))
    step = first_step(config)
    if step != int(state.step):
        state = state.replace(step=jax.numpy.asarray(step, state.step.dtype))
    # The schedule reads its own count in the optimizer state (optax's ScaleByScheduleState): it follows the step.
    # Adam's own count (bias correction) stays with its moments.
    is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
    opt_state = jax.tree.map(
        lambda s: s._replace(count=jax.numpy.full_like(s.count, step)) if is_schedule(s) else s,
        state.opt_state, is_leaf=is_schedule)
    return state.replace(opt_state=opt_state)


def _resolve_iterator_origin(resolved, before, step: int) -> None:
    """config.branch.seed_base and first_step: what `iterator_origin` builds the branch's iterators from. Going on
    with the parent's stream, they are the parent's (its own seed, or its own branch's); a new order moves the seed
    by the branch's step and starts the stream at the branch's first step."""
    b = resolved.branch
    if b.data == "continued":
        parent_is_branch = bool(before.get("branch_from"))
        b.seed_base = before.branch.seed_base if parent_is_branch else before.seed
        stage = next(s for s in stages_lib.plan(resolved) if s.end > step)
        parent_first = before.branch.first_step if parent_is_branch else -1
        b.first_step = parent_first if parent_first >= stage.start else stage.start
    else:
        b.seed_base = (resolved.seed + RESEED_OFFSET * (step + 1)) % 2**31
        b.first_step = first_step(resolved)


def _changed_data_keys(before, after) -> list[str]:
    old, new = _data_view(before), _data_view(after)
    return [f"config.{k}" for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]


def tokenizer_dir(config) -> str:
    """The parent's tokenizer folder, which a branch tokenizes with ("" when config.data.tokenizer.path names
    one, which both then read)."""
    ref = parent(config)
    return "" if ref is None or config.data.tokenizer.path else str(ref.run.tokenizer)


def _recorded_config(workdir: str | None):
    """The config a resumed branch recorded (its branch resolved then), or None for a first start."""
    if not workdir or not Workdir(workdir).checkpoint_steps():
        return None
    config_json = paths.fresh(Workdir(workdir).config_json)
    if not config_json.exists():
        return None
    recorded = config_from_json(config_json.read_text())
    return recorded if recorded.get("branch_from") else None


def _same_run(recorded: str, asked: str) -> bool:
    """The recorded DIR:STEP is what `asked` names: the same, or the same DIR with `last` or no step."""
    (dir_a, step_a, _), (dir_b, step_b, _) = reference.split(recorded), reference.split(asked)
    return dir_a == dir_b and (step_b in (None, reference.LAST) or step_a == step_b)


def _data_view(config) -> dict:
    """The keys a branch's batches are made of (DATA_KEYS), as JSON values, paths and other passing keys left out
    (the data fingerprint checks what a path holds)."""
    flat = experiment.flatten(json.loads(config.to_json_best_effort()))
    return {k: v for k, v in flat.items()
            if any(k == p or k.startswith(p) for p in DATA_KEYS) and not experiment.passes(k)}


def _check_shapes(before, config, ref) -> None:
    """Another family, or a model key that changes a parameter's shape, is refused naming the key."""
    old_family, new_family = before.model.family, config.model.family
    if old_family != new_family:
        raise bert_jax.UserError(f"config.model.family={new_family!r}: {KEY}={ref} is a {old_family!r} run; a branch "
                                 f"keeps its parent's family")
    old, new = before.model.to_dict(), config.model.to_dict()
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if not changed:
        return
    shapes = lambda m: jax.tree.map(lambda a: a.shape, abstract_params_for(m))  # noqa: E731
    if shapes(old) == shapes(new):
        return
    reference_shapes = shapes(old)
    for key in changed:
        if key in new and shapes(dict(old, **{key: new[key]})) != reference_shapes:
            raise bert_jax.UserError(
                f"config.model.{key}={new[key]!r} changes a parameter's shape ({KEY}={ref} has {key}="
                f"{old.get(key)!r}); a branch keeps its parent's parameters: change it in a new run (or grow one: "
                f"config.grow_from)")
    raise bert_jax.UserError(f"config.model.{', config.model.'.join(changed)} change the parameters' shapes together "
                             f"({KEY}={ref}); a branch keeps its parent's parameters")
