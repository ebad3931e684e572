"""The model-family registry: the only place that knows family names.

A family is a module builder plus an objective; the train loop asks the registry for
`config.model.family` and never branches on the name.
"""
import dataclasses
from typing import Callable

import flax.linen as nn

from bert_jax.objectives.objective import Objective


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    build_model: Callable[..., nn.Module]  # config.model -> module whose __call__(batch, deterministic) -> outputs
    objective: Objective


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
