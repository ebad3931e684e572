"""Checks that fail before any compilation, naming the config key at fault.

A key another key would cap, override or disable resolves visibly or is refused here, naming both
(docs/reference/configs.md, "Coupled keys", lists every such coupling and its test):
`resolve_config` turns `config.data.max_predictions_per_seq=auto` (and `config.data.worker_count=auto`) into
its number and logs it, and
`validate_config` refuses a set cap that would bind below the mask rate asked for.
"""
import jax
from absl import logging

from bert_jax.families import get_family
from bert_jax.train import stages
from data_pipelines.sources import mixture
from data_pipelines.loader import masking, pipeline, workers


def resolve_config(config):
    """A copy of `config` with every `auto` resolved to its value, each logged as `key=auto -> value`.

    What a run records in DIR/config.json and compares on resume is this resolved config, so a
    changed mask_rate under `auto` shows up as a changed max_predictions_per_seq too.
    """
    resolved = config.copy_and_resolve_references()
    with resolved.unlocked():
        if resolved.data.max_predictions_per_seq == masking.AUTO:
            value = masking.max_predictions(resolved.data)
            logging.info("config.data.max_predictions_per_seq=auto -> %d (ceil(mask_rate %g x max_seq_length %d))",
                         value, resolved.data.mask_rate, resolved.data.max_seq_length)
            del resolved.data["max_predictions_per_seq"]  # a str field once copied: it takes no int in place
            resolved.data.max_predictions_per_seq = value
        if resolved.data.worker_count == workers.AUTO:
            value = workers.worker_count(workers.AUTO)
            logging.info("config.data.worker_count=auto -> %d (%d cores; data_pipelines/loader/workers.py)",
                         value, workers.host_cores())
            with resolved.data.ignore_type():  # a str field once copied
                resolved.data.worker_count = value
        workers.worker_count(resolved.data.worker_count)  # anything else fails now, naming the key
    return resolved


def check_mask_budget(data_cfg, prefix: str = "config.data") -> None:
    """A set max_predictions_per_seq below ceil(mask_rate x max_seq_length) would silently lower the mask rate
    of full rows (80 at seq 512 trains a 40 % sweep arm at 15.6 %): refused, naming both keys and what fits."""
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


def validate_config(config, num_processes: int = 1) -> None:
    m, d, t = config.model, config.data, config.train
    family = get_family(m.family)  # unknown family: lists the known ones
    if family.validate_config is not None:
        family.validate_config(config)
    family.kernel_choice(m)  # an attention kernel this platform cannot run, or that cannot apply the dropout
    if m.hidden_size % m.num_heads:
        raise ValueError(
            f"config.model.num_heads={m.num_heads} does not divide config.model.hidden_size={m.hidden_size}"
        )
    if d.max_seq_length > m.max_position_embeddings:
        raise ValueError(
            f"config.data.max_seq_length={d.max_seq_length} exceeds "
            f"config.model.max_position_embeddings={m.max_position_embeddings}"
        )
    check_mask_budget(d)
    if t.grad_accum_steps < 1 or t.global_batch_size % t.grad_accum_steps:
        raise ValueError(
            f"config.train.grad_accum_steps={t.grad_accum_steps} must divide "
            f"config.train.global_batch_size={t.global_batch_size}"
        )
    if t.global_batch_size % num_processes:
        raise ValueError(
            f"config.train.global_batch_size={t.global_batch_size} does not split over {num_processes} processes"
        )
    if not 0 <= t.warmup_steps <= t.num_steps:
        raise ValueError(f"config.train.warmup_steps={t.warmup_steps} must be in [0, num_steps={t.num_steps}]")
    if t.nan_policy not in ("stop", "skip"):
        raise ValueError(f"config.train.nan_policy={t.nan_policy!r}; expected 'stop' or 'skip'")
    for key in ("log_every_steps", "eval_every_steps"):
        if t[key] < 1:
            raise ValueError(f"config.train.{key}={t[key]} must be >= 1")
    if config.checkpoint.every_steps < 1:
        raise ValueError(f"config.checkpoint.every_steps={config.checkpoint.every_steps} must be >= 1")
    _check_objective_fits_batches(config)
    _check_stages(config, num_processes)
    mixture.check_mixture(d)  # data.mixture's names, weights, schedule and sources (sources/mixture.py)


def _check_stages(config, num_processes: int) -> None:
    """Each stage of config.train.stages is a valid config too (its own mask budget, batch split...)."""
    for stage in stages.plan(config)[1:]:  # plan() refuses a bad declaration, naming the stage and key
        staged = resolve_config(stage.config)
        with staged.unlocked():
            staged.train.stages = ()
        try:
            validate_config(staged, num_processes)
        except ValueError as error:
            raise ValueError(f"config.train.stages[{stage.index - 1}] (from step {stage.start}): {error}") from None


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
