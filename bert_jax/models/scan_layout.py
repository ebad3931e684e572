"""Converting parameters between the scanned layout (one `layers` subtree stacked on a
leading axis) and the unrolled one (`layers_0`, `layers_1`, ...).

Users need both: scanned compiles once per stack and is what training uses at scale;
unrolled is what per-layer tools, exports and `scan_layers=False` runs expect.
"""
from typing import Any

import jax
import numpy as np

SCANNED = "layers"


def unstack_layers(params: dict[str, Any]) -> dict[str, Any]:
    """Every `layers` subtree [num_layers, ...] becomes `layers_0` ... `layers_{n-1}`."""
    out = {}
    for key, value in params.items():
        if key == SCANNED:
            num_layers = jax.tree.leaves(value)[0].shape[0]
            for i in range(num_layers):
                out[f"{SCANNED}_{i}"] = jax.tree.map(lambda x, i=i: x[i], value)
        elif isinstance(value, dict):
            out[key] = unstack_layers(value)
        else:
            out[key] = value
    return out


def stack_layers(params: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `unstack_layers`: `layers_0` ... `layers_{n-1}` become one stacked `layers`."""
    out, layers = {}, {}
    for key, value in params.items():
        prefix, _, index = key.rpartition("_")
        if prefix == SCANNED and index.isdigit():
            layers[int(index)] = value
        elif isinstance(value, dict):
            out[key] = stack_layers(value)
        else:
            out[key] = value
    if layers:
        if sorted(layers) != list(range(len(layers))):
            raise ValueError(f"layer indices {sorted(layers)} are not 0..{len(layers) - 1}")
        ordered = [layers[i] for i in range(len(layers))]
        out[SCANNED] = jax.tree.map(lambda *xs: np.stack(xs), *ordered)
    return out
