"""Growing a model from a smaller one of its family (`config.grow_from`): the larger model's starting params.

ModernBERT-large began from ModernBERT-base's weights this way (Warner et al. 2024, §2.2; AnswerDotAI/ModernBERT,
`src/bert_layers/initialization.py`, mode `tile_weights_from_middle`):

- width: every axis the larger model widens is filled by tiling the smaller tensor periodically, with one whole copy
  placed in the middle of the axis and the copies around it wrapping. Per axis, new index i reads old index
  `(i - (new - old) // 2) mod old`, so every new value is one of the smaller model's values. ModernBERT tiles the
  flattened `heads * head_dim` rows of its fused projections; our kernels keep heads and head size (and Q/K/V, the
  GLU's two halves) as separate axes, so each is tiled on its own: a model with more heads of the same size starts
  with whole copies of the smaller model's heads.
- depth: layer j of n new layers starts as layer `round(j * m / n)` of the m old ones (Python's round, as in
  ModernBERT's `init_model_from_pretrained`), which repeats layers in place, Gopher-style. The rule applies to each
  layer stack (the scanned `layers` subtree or its unrolled `layers_0` ... `layers_{n-1}`); a layer a family keeps
  outside its stack (ModernBERT's first layer) is grown in width like any other parameter.

Nothing here knows a family: the trees are walked by name and shape. A parameter of the same shape in both is
copied bit for bit; one the smaller model lacks keeps the larger model's fresh init. Nothing is rescaled (ModernBERT
does not either): a widened layer's sums grow with its width, and the norms that follow absorb it.
"""
from typing import Any

import jax
import numpy as np

from bert_jax.families import abstract_params_for
from bert_jax.models.scan_layout import SCANNED, stack_layers, unstack_layers


def center_tile(small: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`small` tiled from the middle to `shape` (no axis smaller, same rank); `small` itself where shapes agree."""
    small = np.asarray(small)
    if small.ndim != len(shape) or any(new < old for old, new in zip(small.shape, shape)):
        raise ValueError(f"cannot tile {small.shape} to {tuple(shape)}: same rank and no smaller axis needed")
    out = small
    for axis, (old, new) in enumerate(zip(small.shape, shape)):
        if new != old:
            out = np.take(out, (np.arange(new) - (new - old) // 2) % old, axis=axis)
    return out


def layer_sources(small_layers: int, big_layers: int) -> list[int]:
    """For each of `big_layers` layers, the index of the smaller stack's layer it starts from.

    ModernBERT's rule, capped at the last layer: where the depth more than doubles, round(j * m / n) can reach m
    (2 -> 4 layers: round(1.5) = 2), which ModernBERT's code would index past its stack with.
    """
    return [min(round(j * small_layers / big_layers), small_layers - 1) for j in range(big_layers)]


def grow_params(small: dict[str, Any], fresh: dict[str, Any]) -> dict[str, Any]:
    """The larger model's starting params: `fresh` (its own init, numpy, scanned or unrolled) with every parameter
    the smaller model has (`small`, scanned or unrolled as it trained) copied in, tiled wider and repeated deeper.

    Raises ValueError naming the first parameter that would have to shrink.
    """
    def tile(old, new, path):
        try:
            return center_tile(old, np.shape(new)).astype(np.asarray(new).dtype, copy=False)
        except ValueError as error:
            raise ValueError(f"parameter {path}: {error}") from None

    scanned = _has_scanned(fresh)
    grown = _grow(unstack_layers(small), unstack_layers(fresh), "", tile)
    return stack_layers(grown) if scanned else grown


def check_growable(small: dict[str, Any], big: dict[str, Any]) -> None:
    """What `grow_params` would refuse, from abstract params (anything with .shape), with nothing allocated.

    Catches what no single config key shows, e.g. more heads of a smaller head size.
    """
    def check(old, new, path):
        if old.ndim != new.ndim or any(b < a for a, b in zip(old.shape, new.shape)):
            raise ValueError(f"parameter {path} is {old.shape} there, {new.shape} here: growth cannot shrink an axis")
        return new

    # Zero-stride views: indexing layers out of a stack costs no memory, whatever the model's size.
    def views(tree):
        return jax.tree.map(lambda a: np.broadcast_to(np.zeros((), np.float32), a.shape), tree)

    _grow(unstack_layers(views(small)), unstack_layers(views(big)), "", check)


# The sizes a grown model may only keep or enlarge, checked by name before its parameters are.
GROWN_KEYS = ("hidden_size", "num_layers", "intermediate_size", "num_heads")


def check_source(source_model, model) -> None:
    """A ValueError (one line, naming the key and both values) unless `model` (a config.model) can grow from
    `source_model` (the source run's): same family, same vocabulary, no size smaller, no parameter axis smaller."""
    if source_model.family != model.family:
        raise ValueError(f"family {source_model.family} there, {model.family} here")
    if source_model.vocab_size != model.vocab_size:
        raise ValueError(f"config.model.vocab_size={model.vocab_size} here, {source_model.vocab_size} there: a grown "
                         f"run keeps its source's tokenizer, so the vocabulary must match")
    for key in GROWN_KEYS:
        if model[key] < source_model[key]:
            raise ValueError(f"config.model.{key}={model[key]} is smaller than the source run's {source_model[key]}: "
                             f"growth only widens and deepens")
    check_growable(abstract_params_for(source_model), abstract_params_for(model))


def _grow(small: dict, fresh: dict, where: str, tile) -> dict:
    small_stack, fresh_stack = _layer_keys(small), _layer_keys(fresh)
    sources = dict(zip(fresh_stack, (small_stack[i] for i in layer_sources(len(small_stack), len(fresh_stack))))) \
        if small_stack else {}
    out = {}
    for key, value in fresh.items():
        source = sources.get(key, key)
        path = f"{where}/{key}" if where else key
        if source not in small:
            out[key] = value  # the smaller model lacks it: the fresh init stays
        elif isinstance(value, dict):
            out[key] = _grow(small[source], value, path, tile)
        else:
            out[key] = tile(small[source], value, path)
    return out


def _layer_keys(tree: dict) -> list[str]:
    """The unrolled stack's keys in layer order: `layers_0`, `layers_1`, ..."""
    indices = sorted(int(key.rpartition("_")[2]) for key in tree
                     if key.rpartition("_")[0] == SCANNED and key.rpartition("_")[2].isdigit())
    return [f"{SCANNED}_{i}" for i in indices]


def _has_scanned(tree: Any) -> bool:
    return isinstance(tree, dict) and any(key == SCANNED or _has_scanned(value) for key, value in tree.items())
