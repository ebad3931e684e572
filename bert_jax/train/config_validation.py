"""The one check of a pre-training config: resolved and validated where a command starts, before anything exists.

`check_config` is what `pretrain` runs before it creates the workdir and what `bert-jax show-config` prints, so
show-config exits 0 exactly when the run would start. The layers below read their own section of the config it
returns and check nothing again.

A key another key would cap, override or disable resolves visibly or is refused here, naming both
(docs/reference/configs.md, "Coupled keys", lists every such coupling and its test):
`resolve_config` turns `config.data.max_predictions_per_seq=auto` (and `config.data.worker_count=auto`) into
its number and logs it, and `validate_config` refuses a set cap that would bind below the mask rate asked for.
A refusal is a `bert_jax.UserError` naming the key the user set.
"""
import json

import jax
from absl import logging

import bert_jax
from bert_jax.families import get_family, mup_multipliers
from bert_jax.models import parametrization
from bert_jax.models.unread import refuse_unread
from bert_jax.models.targets import building_for
from bert_jax.parallel.context import check_context
from bert_jax.hf import folder as hf_folder
from bert_jax.run import profile_window, spike
from bert_jax.run.refusal import refusal, reraise
from bert_jax.storage import paths, preflight
from bert_jax.storage.workdir import Workdir
from bert_jax.checkpoint import reference
from bert_jax.train import branch, budget, growth, optimizer, resume, stages, teacher
from bert_jax.train.budget_clock import BudgetClock
from data_pipelines.loader import masking, pipeline, split_check, workers
from data_pipelines.sources import documents, mixture


def check_config(config, workdir: str | None = None, num_processes: int = 1):
    """`config` resolved (`resolve_config`) and checked as a whole: every key, every stage, and every input it
    names (corpus, mixture sources, tokenizer, init_from_hf, distillation teacher; buckets through
    storage/preflight.py). Returns the config the run records and runs; raises `bert_jax.UserError` naming the key.

    workdir: the run's directory, where a resume keeps the worker count it started with; None for show-config.
    """
    try:
        config, resolved = _resolved(config, workdir)
        config, branched = branch.resolve(config, workdir)  # DIR:last named, a decay's start, the data order
        resolved += branched
        config, budgeted = budget.resolve(config, workdir)  # train.budget: the steps it buys, the schedule's clock
        resolved += budgeted
        validate_config(config, num_processes)
        _check_growth(config, workdir)
        check_inputs(config)
        if workdir:  # a resume of another experiment (a finished run's too) stops here, naming the keys
            resume.check_experiment(config, workdir)
    except (ValueError, FileNotFoundError) as error:  # a check's refusal is the user's; a fault keeps its traceback
        reraise(error)
    for line in resolved:  # logged once the run will start: a refusal stays the one line naming the key
        logging.info("%s", line)
    return config


def resolve_config(config, workdir: str | None = None):
    """A copy of `config` with every `auto` resolved to its value, each logged as `key=auto -> value`.

    What a run records in DIR/config.json and compares on resume is this resolved config, so a
    changed mask_rate under `auto` shows up as a changed max_predictions_per_seq too. On a resume
    (`workdir` holding checkpoints), worker_count=auto is the number the run started with: the batches
    depend on it (data_pipelines/loader/workers.py), so a run relaunched on a host of other cores keeps its own.
    """
    config, resolved = _resolved(config, workdir)
    for line in resolved:
        logging.info("%s", line)
    return config


def _resolved(config, workdir: str | None) -> tuple:
    """(`config` with its `auto` keys resolved, a line per key saying how)."""
    resolved, lines = config.copy_and_resolve_references(), []
    with resolved.unlocked():
        if resolved.data.max_predictions_per_seq == masking.AUTO:
            value = masking.max_predictions(resolved.data)
            how = (f"mask_count=bernoulli: the whole row, max_seq_length {resolved.data.max_seq_length}"
                   if resolved.data.get("mask_count", "exact") == "bernoulli" else
                   f"ceil(mask_rate {resolved.data.mask_rate:g} x max_seq_length {resolved.data.max_seq_length})")
            lines.append(f"config.data.max_predictions_per_seq=auto -> {value} ({how})")
            del resolved.data["max_predictions_per_seq"]  # a str field once copied: it takes no int in place
            resolved.data.max_predictions_per_seq = value
        if resolved.data.worker_count == workers.AUTO:
            recorded = _recorded_worker_count(workdir) if workdir else None
            if recorded is None:
                value = workers.worker_count(workers.AUTO)
                lines.append(f"config.data.worker_count=auto -> {value} ({workers.host_cores()} cores; "
                             f"data_pipelines/loader/workers.py)")
            else:
                value = recorded
                lines.append(f"config.data.worker_count=auto -> {value}, as the run started with (this host would "
                             f"resolve {workers.auto_worker_count()})")
            with resolved.data.ignore_type():  # a str field once copied
                resolved.data.worker_count = value
        workers.worker_count(resolved.data.worker_count)  # anything else fails now, naming the key
        context = resolved.mesh.get("context", 1)
        if context != 1 and resolved.model.get("attention_impl", "auto") == "auto":  # the kernel that splits
            resolved.model.attention_impl = "xla"
            lines.append(f"config.model.attention_impl=auto -> xla (config.mesh.context={context}: the kernel that "
                         f"splits attention over the context axis)")
        lines += _resolve_mup(resolved)
        # Temperature sampling: each source's size, counted once (or the recorded one on a resume), and its weights.
        lines += mixture.resolve_sizes(resolved.data, _recorded_data(workdir))
    return resolved, lines


def _resolve_mup(config) -> list[str]:
    """Under μP, config.model.mup_multipliers (empty until then) set to what the run applies: the width
    multiplier, the attention logits' factor and each role's init and learning-rate factors, as show-config
    prints them; a line saying so."""
    if not parametrization.is_mup(config.model):
        return []
    parametrization.check(config.model)  # a base width that does not divide: one line, before any model is built
    mup = mup_multipliers(config.model)
    resolved = {"width_multiplier": mup.width, "attention_logits": (
        f"x {parametrization.attention_multiplier(config.model):.6g} / sqrt(head_dim) (1/head_dim, equal to "
        f"standard at hidden_size {config.model.mup_base_width})"), **mup.summary()}
    config.model.mup_multipliers = resolved
    return [f"config.model.parametrization=mup -> width multiplier {mup.width:g} (hidden_size "
            f"{config.model.hidden_size} / mup_base_width {config.model.mup_base_width})"]


def _recorded_data(workdir: str | None) -> dict | None:
    """DIR/config.json's data section when DIR holds checkpoints (a resume); None for a fresh run."""
    run = Workdir(workdir) if workdir else None
    if run is None or not run.checkpoint_steps() or not paths.fresh(run.config_json).exists():
        return None
    return json.loads(paths.fresh(run.config_json).read_text()).get("data")


def _recorded_worker_count(workdir: str) -> int | None:
    """The worker count DIR/config.json recorded, when DIR holds checkpoints; None for a fresh run."""
    run = Workdir(workdir)
    if not run.checkpoint_steps():
        return None
    config_json = paths.fresh(run.config_json)
    if not config_json.exists():
        return None
    recorded = json.loads(config_json.read_text()).get("data", {}).get("worker_count")
    return recorded if isinstance(recorded, int) else None


def validate_config(config, num_processes: int = 1) -> None:
    """The checks that need the config alone (and the sources a mixture names): names, ranges, coupled keys and
    every stage. Raises ValueError naming the key."""
    m, t = config.model, config.train
    family = get_family(m.family)  # unknown family: lists the known ones
    if m.num_heads < 1 or m.hidden_size % m.num_heads:
        raise ValueError(
            f"config.model.num_heads={m.num_heads} does not divide config.model.hidden_size={m.hidden_size}"
        )
    parametrization.check(m)  # config.model.parametrization, mup_base_width
    if family.validate_config is not None:
        family.validate_config(config)
    with building_for(packed_rows="segment_ids" in pipeline.batch_spec(config.data, 1)):
        family.kernel_choice(m)  # an attention kernel this target cannot run, or that cannot apply the dropout or rows
    refuse_unread(m, family.unread, m.family)  # a key this family's model, or this mode, leaves unread
    if t.num_steps < 1:
        raise ValueError(f"config.train.num_steps={t.num_steps} must be >= 1")
    optimizer.make_optimizer(t)  # config.train.optimizer and its keys
    optimizer.learning_rate_schedule(t)  # config.train.schedule and its keys
    clock = BudgetClock.of(t)  # under a budget, warmup is a position on the schedule as written
    length = t.num_steps if clock is None else clock.schedule_length
    if not 0 <= t.warmup_steps <= length:
        raise ValueError(f"config.train.warmup_steps={t.warmup_steps} must be in [0, "
                         f"config.train.num_steps={length}]")
    if t.nan_policy not in ("stop", "skip"):
        raise ValueError(f"config.train.nan_policy={t.nan_policy!r}; expected 'stop' or 'skip'")
    spike.check_config(t.spike)
    profile_window.check(t.profile, t.num_steps)  # a window past the run's end is refused here
    for key in ("log_every_steps", "eval_every_steps"):
        if t[key] < 1:
            raise ValueError(f"config.train.{key}={t[key]} must be >= 1")
    if config.checkpoint.every_steps < 1:
        raise ValueError(f"config.checkpoint.every_steps={config.checkpoint.every_steps} must be >= 1")
    keep_every, every = config.checkpoint.get("keep_every_steps", 0), config.checkpoint.every_steps
    if keep_every < 0 or keep_every % every:
        raise bert_jax.UserError(f"config.checkpoint.keep_every_steps={keep_every} must be 0 (off) or a positive "
                                 f"multiple of config.checkpoint.every_steps={every}: only saved steps can be kept")
    if not 0 <= t.ema_decay < 1:
        raise bert_jax.UserError(f"config.train.ema_decay={t.ema_decay} must be in [0, 1) (0: no EMA)")
    _check_downstream_probe(config)
    _check_stage_keys(config, num_processes)
    for stage in stages.plan(config):  # plan() refuses a bad declaration, naming the stage and key
        if not stage.source:
            continue  # stage 0 as written: checked above
        try:
            _check_stage_keys(stage.config, num_processes)
        except ValueError as error:
            if refusal(error) is None:  # a fault keeps its traceback, not a stage's name
                raise
            raise ValueError(f"{stage.source} (from step {stage.start}): {error}") from None
    mixture.check_mixture(config.data)  # data.mixture's names, weights, schedule and sources (sources/mixture.py)


def _check_downstream_probe(config) -> None:
    """config.eval's probe keys (configs/base.py; the suite itself is read by bert_jax/finetune/downstream_probe.py)."""
    e = config.eval
    if not e.downstream_suite:
        return
    every, eval_every = e.downstream_every_steps, config.train.eval_every_steps
    if every < 0:
        raise ValueError(f"config.eval.downstream_every_steps={every} must be >= 0 (0: at the last step only)")
    if every and every % eval_every:
        raise ValueError(f"config.eval.downstream_every_steps={every} is not a multiple of "
                         f"config.train.eval_every_steps={eval_every}: the probe runs at eval steps")
    if not e.downstream_data_dir:
        raise ValueError(f"config.eval.downstream_suite={e.downstream_suite!r} needs "
                         f"config.eval.downstream_data_dir (a GLUE-layout directory)")


def _check_stage_keys(config, num_processes: int) -> None:
    """What a stage may change (bert_jax/train/stages.py STAGE_KEYS) and what depends on it: the sequence length,
    the masking and its budget, the batch split, the batch keys the objective trains on."""
    m, d, t = config.model, config.data, config.train
    if d.max_seq_length < 5:
        raise ValueError(f"config.data.max_seq_length={d.max_seq_length} must be >= 5: a row holds "
                         f"[CLS] A [SEP] B [SEP]")
    if d.max_seq_length > m.max_position_embeddings:
        raise ValueError(
            f"config.data.max_seq_length={d.max_seq_length} exceeds "
            f"config.model.max_position_embeddings={m.max_position_embeddings}; raise the latter with "
            f"--config.model.max_position_embeddings={d.max_seq_length} (the exported config.json carries it)"
        )
    masking.MaskingSpec.from_config(d).validate()  # the masking mode and mask_rate, before the budget they derive
    check_mask_budget(d)
    if t.global_batch_size < 1:
        raise ValueError(f"config.train.global_batch_size={t.global_batch_size} must be >= 1")
    if t.grad_accum_steps < 1 or t.global_batch_size % t.grad_accum_steps:
        raise ValueError(
            f"config.train.grad_accum_steps={t.grad_accum_steps} must divide "
            f"config.train.global_batch_size={t.global_batch_size}"
        )
    if t.global_batch_size % num_processes:
        raise ValueError(
            f"config.train.global_batch_size={t.global_batch_size} does not split over {num_processes} processes"
        )
    if d.get("objective", "") != m.get("objective", ""):  # the pipeline's copy of the model's (configs/base.py)
        raise ValueError(f"config.data.objective={d.get('objective')!r} differs from config.model.objective="
                         f"{m.get('objective')!r}: set config.model.objective alone (the data follows it)")
    kernel = get_family(m.family).kernel_choice(m)  # a kernel that cannot apply this stage's attention (causal)
    check_context(config, kernel.impl)  # config.mesh.context: a length it splits evenly, the xla kernel
    _check_objective_fits_batches(config)


def check_mask_budget(data_cfg, prefix: str = "config.data") -> None:
    """A set max_predictions_per_seq below ceil(mask_rate x max_seq_length) would silently lower the mask rate
    of full rows (80 at seq 512 trains a 40 % sweep arm at 15.6 %): refused, naming both keys and what fits."""
    if not 0 < data_cfg.mask_rate < 1:  # the key the user set, not the cap derived from it
        raise ValueError(f"{prefix}.mask_rate={data_cfg.mask_rate} must be in (0, 1)")
    cap = masking.max_predictions(data_cfg)
    length = data_cfg.max_seq_length
    if not 0 < cap <= length:
        raise ValueError(f"{prefix}.max_predictions_per_seq={cap} must be in (0, {prefix}.max_seq_length={length}]")
    needed = masking.expected_predictions(data_cfg.mask_rate, length)
    if cap < needed:
        raise ValueError(
            f"{prefix}.max_predictions_per_seq={cap} caps {prefix}.mask_rate={data_cfg.mask_rate}: a row of "
            f"{prefix}.max_seq_length={length} would be masked at most {cap / length:.1%}, not "
            f"{data_cfg.mask_rate:.1%}. Set {prefix}.max_predictions_per_seq={needed} (or auto, which derives it)"
        )


def _check_objective_fits_batches(config) -> None:
    """The family's objective must find its labels among the keys the example builder produces."""
    spec = pipeline.batch_spec(config.data, 1)
    batch = {key: jax.ShapeDtypeStruct(shape, dtype) for key, (shape, dtype) in spec.items()}
    try:
        jax.eval_shape(get_family(config.model.family).objective_for(config.model).weights, batch)
    except KeyError as missing:
        raise ValueError(
            f"config.model.family={config.model.family!r} trains on batch key {missing}, which "
            f"config.data.example_builder={config.data.example_builder!r} does not produce "
            f"(its batches hold {sorted(spec)}); choose a builder that does"
        ) from None


def check_inputs(config) -> None:
    """Every input the config names can be read: buckets through storage/preflight.py (a missing one fails naming
    its URL and the key), then the corpus (or each mixture source), the tokenizer, init_from_hf and the teacher."""
    tokenizer_path, init_from_hf = config.data.tokenizer.path, config.init_from_hf
    inputs = {"config.data.path": config.data.path, "config.data.tokenizer.path": tokenizer_path,
              "config.init_from_hf": init_from_hf, "config.distill.teacher": config.distill.teacher,
              **mixture.storage_paths(config.data)}
    for key, url in inputs.items():
        if url and paths.is_remote(url):
            preflight.check_readable(url, key)
    if not mixture.has_mixture(config.data):  # a mixture's sources were read by check_mixture
        documents.check_source(config.data)
    split_check.check_both_splits(config.data)  # a one-document corpus stops here, before anything is written
    if tokenizer_path and not paths.path(tokenizer_path).exists():
        raise bert_jax.UserError(f"config.data.tokenizer.path={tokenizer_path!r} does not exist; name a vocab.txt, "
                                 f"tokenizer.json or .model file, or a folder holding one ('' trains one)")
    if init_from_hf:
        try:
            hf_folder.read_hf_config(init_from_hf)
        except ValueError as error:
            raise bert_jax.UserError(f"config.init_from_hf={init_from_hf!r}: {error}") from None
    teacher.resolve_teacher(config)  # config.distill.teacher exists, holds weights, fits the student


def _check_growth(config, workdir: str | None) -> None:
    """config.grow_from names a committed checkpoint of a smaller run of this family; only a fresh run reads it."""
    grow_from = config.grow_from
    if not grow_from or (workdir and Workdir(workdir).checkpoint_steps()):
        return
    for other in ("init_from_hf", "branch_from"):
        if config.get(other, ""):
            raise bert_jax.UserError(f"config.grow_from and config.{other} are both set: a fresh run starts from one "
                                     f"of them")
    source = reference.resolve(grow_from, "config.grow_from", allow_ema=True)
    try:
        growth.check_source(source.config().model, config.model)
    except ValueError as error:
        raise bert_jax.UserError(f"config.grow_from={grow_from!r}: {error}") from None


def validate_mesh_fit(config, mesh) -> None:
    """The micro-batch must split evenly over the devices that share the batch axis, heads over `tensor`."""
    tensor = mesh.shape["tensor"]
    heads = config.model.num_heads
    if tensor > 1 and heads % tensor:
        fits = max(t for t in range(1, tensor) if heads % t == 0 and mesh.size % t == 0)
        raise ValueError(
            f"config.model.num_heads={heads} does not split over the tensor axis of config.mesh.shape "
            f"({tensor} devices); try --config.mesh.shape=(1,-1,{fits})"
        )
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    micro = config.train.global_batch_size // config.train.grad_accum_steps
    if micro % shards:
        raise ValueError(
            f"config.train.global_batch_size={config.train.global_batch_size} / grad_accum_steps="
            f"{config.train.grad_accum_steps} = {micro} does not split over {shards} data-parallel devices"
        )
