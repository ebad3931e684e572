"""Mesh construction and placement by logical axis names.

The mesh has axes (data, fsdp, tensor); `config.mesh.logical_axis_rules` maps the
model's logical names onto them. One device is simply the (1, 1, 1) mesh.
"""
import math
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")


def resolve_mesh_shape(shape, num_devices: int) -> tuple[int, ...]:
    """Fills one -1 with the devices left over; fails naming config.mesh.shape otherwise."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != len(MESH_AXES):
        raise ValueError(f"config.mesh.shape={shape} must have {len(MESH_AXES)} entries {MESH_AXES}")
    if shape.count(-1) > 1:
        raise ValueError(f"config.mesh.shape={shape} has more than one -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if num_devices % known:
            raise ValueError(f"config.mesh.shape={shape}: {num_devices} devices do not divide by {known}")
        shape = tuple(num_devices // known if s == -1 else s for s in shape)
    if math.prod(shape) != num_devices:
        raise ValueError(f"config.mesh.shape={shape} needs {math.prod(shape)} devices, but {num_devices} are present")
    return shape


def make_mesh(mesh_cfg, devices=None) -> Mesh:
    devices = jax.devices() if devices is None else devices
    shape = resolve_mesh_shape(mesh_cfg.shape, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def logical_axis_rules(mesh_cfg) -> tuple[tuple[str, Any], ...]:
    return tuple((name, tuple(axes) if isinstance(axes, (list, tuple)) else axes)
                 for name, axes in mesh_cfg.logical_axis_rules)


def logical_shardings(boxed_tree: Any, mesh: Mesh, rules) -> Any:
    """NamedShardings for a tree whose leaves are boxed with logical names (unboxed leaves: replicated)."""
    specs = nn.get_partition_spec(boxed_tree)
    return nn.logical_to_mesh_sharding(specs, mesh, rules)


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
