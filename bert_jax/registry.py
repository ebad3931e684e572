"""Registries: the one place that maps a name a user writes (a config value, a flag) to what it means.

A family, a task kind, a tokenizer kind, a data source, an example builder, a masking mode and a launch executor
are each registered here by name, next to their code, and looked up by that name; nothing else branches on the
string. An unknown name is the user's mistake: `get` raises `bert_jax.UserError` naming the key, the value, the
known names and the closest one ("did you mean"). Modelled on big_vision's pp registry (register by decorator,
look up by name, a temporary entry for tests).
"""
from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

import bert_jax

T = TypeVar("T")


class Registry(Generic[T]):
    """Names -> entries, in registration order.

    Args:
      key: what the user sets to pick an entry, as the error names it: "config.data.source", "--executor".
      plural: what the entries are, for "known <plural>: ...".
    """

    def __init__(self, key: str, plural: str):
        self.key = key
        self.plural = plural
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T | None = None):
        """Registers `entry` under `name` and returns it; without `entry`, a decorator that does so."""
        if entry is None:
            return lambda decorated: self.register(name, decorated)
        if name in self._entries:
            raise ValueError(f"{self.key}: {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(tuple(self._entries.items()))

    def __contains__(self, name) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        """The names (so a registry serves as argparse's `choices`)."""
        return iter(self.names())

    def get(self, name: str, key: str | None = None) -> T:
        """The entry registered as `name`; `key` names the setting where it is not the registry's own (a mixture's
        `config.data.mixture.web.source`)."""
        if name not in self._entries:
            raise bert_jax.UserError(self.unknown(name, key))
        return self._entries[name]

    def unknown(self, name, key: str | None = None) -> str:
        """The one line that says `name` is not registered: the key, the value, the known names, the closest."""
        known = sorted(self._entries)
        line = f"{key or self.key}={name!r} is unknown; known {self.plural}: {', '.join(known)}"
        close = difflib.get_close_matches(str(name), known, n=1)
        return f"{line}; did you mean {close[0]!r}?" if close else line

    @contextlib.contextmanager
    def temporary(self, name: str, entry: T) -> Iterator[T]:
        """Registers `entry` for the length of a `with` block (tests: a source or builder of their own)."""
        self.register(name, entry)
        try:
            yield entry
        finally:
            del self._entries[name]


def registered_as(registry: Registry, name: str) -> Callable[[type], type]:
    """A class decorator that registers the class under `name` and records the name on it (`cls.name`)."""
    def decorate(cls: type) -> type:
        cls.name = name
        return registry.register(name, cls)
    return decorate
