"""Checks that fail before any compilation, naming the config key at fault."""
import jax

from bert_jax.families import get_family
from bert_jax.models.attention import choose_kernel
from data_pipelines.loader import pipeline


def validate_config(config, num_processes: int = 1) -> None:
    m, d, t = config.model, config.data, config.train
    family = get_family(m.family)  # unknown family: lists the known ones
    if family.validate_config is not None:
        family.validate_config(config)
    choose_kernel(m)  # an attention kernel this platform cannot run, or that cannot apply the dropout
    if m.hidden_size % m.num_heads:
        raise ValueError(
            f"config.model.num_heads={m.num_heads} does not divide config.model.hidden_size={m.hidden_size}"
        )
    if d.max_seq_length > m.max_position_embeddings:
        raise ValueError(
            f"config.data.max_seq_length={d.max_seq_length} exceeds "
            f"config.model.max_position_embeddings={m.max_position_embeddings}"
        )
    if not 0 < d.max_predictions_per_seq <= d.max_seq_length:
        raise ValueError(
            f"config.data.max_predictions_per_seq={d.max_predictions_per_seq} must be in "
            f"(0, config.data.max_seq_length={d.max_seq_length}]"
        )
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
