"""config.model keys a model leaves unread, declared where its family is registered (bert_jax/families.py).

An override takes effect or is refused (docs/design.md): `--config.model.fused_qkv=true` on a family whose attention
is its own (ModernBERT's, DeBERTa-v3's) would train exactly what the default trains. Each family declares the keys
its module never reads, and the keys it leaves unread in a mode (the per-step dropout masks have no fused
dropout-and-norm); config validation refuses any other value than the one that does nothing, naming the key.
tests/test_family_keys.py traces every family at micro shapes and checks that every other key is read.
"""
import dataclasses
from typing import Any, Iterable

import bert_jax


@dataclasses.dataclass(frozen=True)
class Unread:
    """Keys left unread, each with the value that says so (configs/base.py's), always or while config.model.<when[0]>
    is when[1]."""

    keys: tuple[tuple[str, Any], ...]
    when: tuple[str, Any] | None = None

    @classmethod
    def of(cls, when: tuple[str, Any] | None = None, **keys) -> "Unread":
        return cls(tuple(sorted(keys.items())), when)

    def applies(self, model_cfg) -> bool:
        return self.when is None or model_cfg.get(self.when[0]) == self.when[1]


def unread_keys(model_cfg, declared: Iterable[Unread]) -> dict[str, Unread]:
    """The keys `model_cfg` leaves unread under `declared`, each with the declaration that says so."""
    return {key: entry for entry in declared if entry.applies(model_cfg) for key, _ in entry.keys}


def refuse_unread(model_cfg, declared: Iterable[Unread], family: str) -> None:
    """A `bert_jax.UserError` naming the first key of `model_cfg` that is unread here yet set to another value than
    the one that does nothing."""
    for entry in declared:
        if not entry.applies(model_cfg):
            continue
        for key, inert in entry.keys:
            value = model_cfg.get(key, inert)
            if value != inert:
                where = (f"under config.model.{entry.when[0]}={entry.when[1]!r} (family {family!r})" if entry.when
                         else f"on family {family!r}, whose model does not read it")
                raise bert_jax.UserError(f"config.model.{key}={value!r} does nothing {where}: leave it at {inert!r}")
