"""Mesh construction and placement by logical axis names.

The mesh has axes (data, fsdp, context, tensor). `config.mesh.shape` is the (data, fsdp, tensor)
shape inside one slice (ICI), `config.mesh.dcn_shape` the shape across slices (DCN); the mesh is
their elementwise product. `config.mesh.context` (default 1) is the context axis inside a slice:
it splits each sequence (the logical `length` axis) over that many devices, and a -1 in the shape
takes what the context axis leaves. `config.mesh.rules` picks a preset mapping the model's logical
names onto mesh axes (see `RULE_PRESETS`), or "custom" for `config.mesh.logical_axis_rules`.
One device is simply the (1, 1, 1, 1) mesh.
"""
import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "context", "tensor")
SHAPE_AXES = ("data", "fsdp", "tensor")  # what config.mesh.shape and dcn_shape list; context is its own key

# Every preset splits the batch over (data, fsdp): a device along either axis sees its
# own examples. They differ in what they split of the parameters (and so of Adam's
# moments, which follow the parameters):
#   dp      nothing: every device holds the whole model.
#   fsdp    the `embed` axis over `fsdp` (ZeRO-3 style: gathered per layer, grads reduce-scattered).
#   tp      heads / mlp / vocab over `tensor` (Megatron style: activations split inside a layer).
#   fsdp_tp both; with a mesh axis of size 1 a rule is a no-op, so this default also runs
#           plain DP on (-1, 1, 1) and plain FSDP on (1, -1, 1).
# Every preset maps `length` to `context` (MaxText's activation_length): a no-op at the default
# config.mesh.context=1, each sequence split over the context axis above it.
RULE_PRESETS: dict[str, tuple[tuple[str, Any], ...]] = {
    "dp": (
        ("batch", ("data", "fsdp")), ("length", "context"), ("embed", None), ("heads", None),
        ("kv", None), ("mlp", None), ("vocab", None), ("layers", None),
    ),
    "fsdp": (
        ("batch", ("data", "fsdp")), ("length", "context"), ("embed", "fsdp"), ("heads", None),
        ("kv", None), ("mlp", None), ("vocab", None), ("layers", None),
    ),
    "tp": (
        ("batch", ("data", "fsdp")), ("length", "context"), ("embed", None), ("heads", "tensor"),
        ("kv", None), ("mlp", "tensor"), ("vocab", "tensor"), ("layers", None),
    ),
    "fsdp_tp": (
        ("batch", ("data", "fsdp")), ("length", "context"), ("embed", "fsdp"), ("heads", "tensor"),
        ("kv", None), ("mlp", "tensor"), ("vocab", "tensor"), ("layers", None),
    ),
}


def _as_shape(shape, key: str) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(SHAPE_AXES):
        raise ValueError(f"config.mesh.{key}={shape} must have {len(SHAPE_AXES)} entries {SHAPE_AXES}")
    return shape


def resolve_mesh_shape(shape, num_devices: int, key: str = "shape") -> tuple[int, ...]:
    """Fills one -1 with the devices left over; fails naming config.mesh.<key> otherwise."""
    shape = _as_shape(shape, key)
    if shape.count(-1) > 1:
        raise ValueError(f"config.mesh.{key}={shape} has more than one -1")
    if any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"config.mesh.{key}={shape}: sizes must be positive (or one -1)")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ValueError(f"config.mesh.{key}={shape}: {num_devices} devices do not divide by {known}")
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(shape) != num_devices:
        raise ValueError(
            f"config.mesh.{key}={shape} needs {math.prod(shape)} devices, but {num_devices} are present; "
            f"put -1 on one axis to use them all, e.g. --config.mesh.{key}=(-1,1,1)"
        )
    return shape


def context_size(mesh_cfg) -> int:
    """config.mesh.context: the devices each sequence is split over (1: none)."""
    context = mesh_cfg.get("context", 1)
    if not isinstance(context, int) or context < 1:
        raise ValueError(f"config.mesh.context={context!r} must be a positive integer (1: sequences stay whole)")
    return context


def dcn_shape(mesh_cfg) -> tuple[int, ...]:
    """config.mesh.dcn_shape, (data, fsdp, tensor) across slices. The context axis has no entry: it stays inside a
    slice, since its all-gathers or ring permutes run in every layer and want ICI bandwidth (as MaxText's does)."""
    dcn = tuple(mesh_cfg.get("dcn_shape", (1, 1, 1)))
    if len(dcn) == len(MESH_AXES):
        raise ValueError(f"config.mesh.dcn_shape={dcn} lists {len(dcn)} axes, but the context axis cannot cross "
                         f"slices (its collectives run every layer, on ICI): give (data, fsdp, tensor) across slices "
                         f"and config.mesh.context within one")
    dcn = _as_shape(dcn, "dcn_shape")
    if any(s < 1 for s in dcn):
        raise ValueError(f"config.mesh.dcn_shape={dcn}: sizes must be >= 1 (no -1 across slices)")
    return dcn


def resolve_mesh_shapes(mesh_cfg, num_devices: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ici_shape, dcn_shape) over MESH_AXES: the DCN shape must be fully given; -1 in the ICI shape fills one
    slice with what config.mesh.context leaves; the context axis stays inside a slice (its all-gathers on ICI)."""
    dcn = dcn_shape(mesh_cfg)
    slices = math.prod(dcn)
    if num_devices % slices:
        raise ValueError(f"config.mesh.dcn_shape={dcn} asks for {slices} slices; {num_devices} devices do not divide")
    context = context_size(mesh_cfg)
    if (num_devices // slices) % context:
        raise ValueError(f"config.mesh.context={context} does not divide the {num_devices // slices} devices of a "
                         f"slice")
    ici = resolve_mesh_shape(mesh_cfg.shape, num_devices // slices // context)
    return _with_context(ici, context), _with_context(dcn, 1)


def _with_context(shape: tuple[int, ...], context: int) -> tuple[int, ...]:
    """A (data, fsdp, tensor) shape as one over MESH_AXES."""
    return (*shape[:2], context, shape[2])


def make_mesh(mesh_cfg, devices=None) -> Mesh:
    """The (data, fsdp, context, tensor) mesh; with any DCN axis > 1, a hybrid mesh whose DCN axes cross slices.

    Devices that all sit in one slice (GPUs, CPUs, one TPU slice) count each process
    as a slice instead, so `dcn_shape` puts the links between hosts on the chosen axis.
    """
    devices = jax.devices() if devices is None else devices
    ici, dcn = resolve_mesh_shapes(mesh_cfg, len(devices))
    if math.prod(dcn) > 1:
        one_slice = len({getattr(d, "slice_index", 0) for d in devices}) == 1
        grid = mesh_utils.create_hybrid_device_mesh(
            ici, dcn, devices, process_is_granule=one_slice, allow_split_physical_axes=True,
        )
    else:
        grid = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES))


def logical_axis_rules(mesh_cfg) -> tuple[tuple[str, Any], ...]:
    """The rules `config.mesh.rules` names; "custom" reads `config.mesh.logical_axis_rules`."""
    preset = mesh_cfg.get("rules", "custom")
    if preset == "custom":
        rules = mesh_cfg["logical_axis_rules"]
    elif preset in RULE_PRESETS:
        rules = RULE_PRESETS[preset]
    else:
        raise ValueError(f"config.mesh.rules={preset!r}; expected one of {(*RULE_PRESETS, 'custom')}")
    out = []
    for name, axes in rules:
        axes = tuple(axes) if isinstance(axes, (list, tuple)) else axes
        for axis in axes if isinstance(axes, tuple) else (axes,):
            if axis is not None and axis not in MESH_AXES:
                raise ValueError(
                    f"config.mesh.logical_axis_rules maps {name!r} to {axis!r}, which is no mesh axis {MESH_AXES}"
                )
        out.append((name, axes))
    return tuple(out)


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules) -> Any:
    """NamedShardings for a tree whose leaves are boxed with logical names (unboxed leaves: replicated)."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


def check_divisible(abstract_tree: Any, shardings: Any, config_hint: str) -> None:
    """Fails naming the first leaf whose axis does not split evenly over its mesh axes.

    jit rejects uneven shards with a traceback naming neither the parameter nor the
    config key; this says both, and what to change.
    """
    leaves = jax.tree_util.tree_flatten_with_path(abstract_tree)[0]
    for (path, leaf), sharding in zip(leaves, jax.tree.leaves(shardings)):
        for dim, (size, axes) in enumerate(zip(leaf.shape, tuple(sharding.spec) + (None,) * leaf.ndim)):
            axes = axes if isinstance(axes, tuple) else (axes,)
            shards = math.prod(sharding.mesh.shape[a] for a in axes if a is not None)
            if size % shards:
                name = "/".join(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
                raise ValueError(
                    f"{name} has {size} entries on axis {dim}, which do not split over mesh axes {axes} "
                    f"({shards} devices) of config.mesh.shape={tuple(sharding.mesh.shape.values())}. "
                    f"{config_hint}"
                )


def shard_shape(global_shape: tuple[int, ...], sharding: NamedSharding) -> tuple[int, ...]:
    """The per-device shape of an array with this sharding (axes divide evenly, see check_divisible)."""
    return tuple(sharding.shard_shape(tuple(global_shape)))


def batch_shards(mesh_shape) -> int:
    """The devices that split the batch (data x fsdp): tensor and context split the work within a sequence."""
    return mesh_shape["data"] * mesh_shape["fsdp"]


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
    """Batches split their leading axis as the logical `batch` axis says; other axes stay whole."""
    spec = nn.logical_to_mesh_axes(("batch",), rules)
    return NamedSharding(mesh, PartitionSpec(*spec))


def global_batch(local_batch: dict, sharding: NamedSharding) -> dict:
    """Assembles this host's numpy batch into global arrays; every host passes only its own share."""
    return {
        k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
        for k, v in local_batch.items()
    }


def host_data_share(sharding: NamedSharding, rows: int) -> dict:
    """This process's share of a global batch of `rows` rows under `sharding`: {process_index, process_count} as
    the data pipeline takes them, one equal contiguous share per distinct set of rows the processes' devices hold.

    `global_batch` takes each process's rows as those its devices hold. Where an axis that does not split the
    batch (context, tensor) spans processes, several processes hold the same rows: they must read the same data,
    or the batch's replicas differ between processes (and the step trains on half the batch, differently on each).
    """
    spans = {}
    for device, index in sharding.devices_indices_map((rows,)).items():
        start, stop, _ = index[0].indices(rows)
        low, high = spans.get(device.process_index, (rows, 0))
        spans[device.process_index] = (min(low, start), max(high, stop))
    shares = sorted(set(spans.values()))
    size = rows // len(shares)
    if shares != [(i * size, (i + 1) * size) for i in range(len(shares))]:
        raise ValueError(f"the processes' devices hold rows {shares} of the {rows}-row batch, not equal contiguous "
                         f"shares: change config.mesh.shape or config.mesh.context so each host's devices hold one")
    if len(shares) == jax.process_count():  # each process its own rows: its own stream, as ever (resumes keep theirs)
        return dict(process_index=jax.process_index(), process_count=jax.process_count())
    return dict(process_index=shares.index(spans[jax.process_index()]), process_count=len(shares))


def host_share(batch: dict, process_index: int, process_count: int) -> dict:
    """This host's rows of a batch every host built whole: the global array is each host's share in process
    order, so a packed batch's example_starts (global row offsets) stay right."""
    if process_count == 1:
        return batch
    out = {}
    for key, value in batch.items():
        rows = len(value)
        if rows % process_count:
            raise ValueError(f"a batch's {key!r} has {rows} rows, which {process_count} processes cannot share "
                             f"evenly; make the batch size (and config.data.pack_rows_multiple) a multiple of it")
        share = rows // process_count
        out[key] = value[process_index * share:(process_index + 1) * share]
    return out
