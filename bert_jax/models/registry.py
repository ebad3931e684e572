"""The model-family registry: the only place that knows family names.

A family is a module builder plus an objective; the train loop asks the registry for
`config.model.family` and never branches on the name.
"""
import dataclasses
from typing import Any, Callable

import flax.linen as nn

from bert_jax.objectives.objective import Objective


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    build_model: Callable[..., nn.Module]  # config.model -> module whose __call__(batch, deterministic) -> outputs
    objective: Objective
    # Optional Hugging Face interop (bert_jax.export, config.init_from_hf); None: the family has none.
    # hf_export(params, model_cfg) -> (state dict of numpy arrays, HF config.json dict)
    hf_export: Callable[..., tuple[dict, dict]] | None = None
    # hf_import(state dict, HF config.json dict, model_cfg, fallback_params) -> (params, report with
    # .kept_from_fallback and .unused lists of HF tensor names)
    hf_import: Callable[..., tuple[dict, Any]] | None = None


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> None:
    if family.name in _FAMILIES:
        raise ValueError(f"model family {family.name!r} is registered twice")
    _FAMILIES[family.name] = family


def known_families() -> list[str]:
    return sorted(_FAMILIES)


def get_family(name: str) -> Family:
    if name not in _FAMILIES:
        raise ValueError(f"config.model.family={name!r} is unknown; known families: {', '.join(known_families())}")
    return _FAMILIES[name]
