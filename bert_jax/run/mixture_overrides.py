"""A data mixture written on the command line: `--config.data.mixture.<name>.<key>=value` overrides.

ml_collections applies an override only to a key the config file defined, so a source could be added, or given a
documented key the file left unset (`on_exhausted`, `field`, ...), only by editing the file. A command run through
bert_jax/run/command_line.py takes these overrides out of argv before absl parses the rest, and sets them on the
loaded config afterwards: a source named for the first time is created, and every key a source may set
(data_pipelines/sources/mixture.py: `weight`, `on_exhausted` and the config.data keys of SOURCE_KEYS) is accepted,
parsed as the type of config.data's key of that name. Any other key is refused, listing the valid ones.

    bert-jax show-config --config=configs/tiny.py \\
        --config.data.mixture.books.source=text --config.data.mixture.books.path=books/*.txt \\
        --config.data.mixture.books.weight=0.7 --config.data.mixture.web.source=jsonl ...
"""
import dataclasses
from collections.abc import Sequence

import ml_collections

from bert_jax import UserError
from data_pipelines.sources import mixture

PREFIX = "--config.data.mixture."
_TYPES = {"weight": float, "on_exhausted": str, "size": int}  # the mixture's own keys; the others are typed as config.data's


@dataclasses.dataclass(frozen=True)
class Override:
    flag: str  # as given, for messages
    source: str
    key: str
    value: str


def take(argv: Sequence[str]) -> tuple[list[str], list[Override]]:
    """(argv without its mixture overrides, those overrides in order). `--flag=value` and `--flag value` alike;
    nothing after `--` is taken."""
    args = list(argv)
    end = args.index("--") if "--" in args else len(args)
    rest, overrides, index = [], [], 0
    while index < end:
        arg = args[index]
        index += 1
        name, has_value, value = arg.partition("=")
        if not name.startswith(PREFIX):
            rest.append(arg)
            continue
        if not has_value:
            if index == end:
                raise UserError(f"{arg}: give a value, {arg}=VALUE")
            value, index = args[index], index + 1
        source, _, key = name[len(PREFIX):].rpartition(".")
        if not source or not key:
            raise UserError(f"{arg}: a mixture override is {PREFIX}<source name>.<key>=VALUE")
        overrides.append(Override(f"{name}={value}", source, key, value))
    return rest + args[end:], overrides


def apply(config: ml_collections.ConfigDict, overrides: Sequence[Override]) -> None:
    """Sets each override on config.data.mixture, creating a source named for the first time."""
    if not overrides:
        return
    valid = mixture.MIXTURE_KEYS + mixture.SOURCE_KEYS
    with config.unlocked():
        for override in overrides:
            if override.key not in valid:
                raise UserError(f"{override.flag}: a mixture source has no key {override.key!r}; its keys: "
                                f"{', '.join(valid)}")
            sources = config.data.mixture
            if override.source not in sources:
                sources[override.source] = ml_collections.ConfigDict()
            spec = sources[override.source]
            value = _parse(override, _TYPES.get(override.key) or type(config.data[override.key]))
            if override.key in spec:
                del spec[override.key]  # the file's type (a weight of 7) gives way to the key's (0.5)
            spec[override.key] = value


def _parse(override: Override, kind: type):
    if kind is str:
        return override.value
    try:
        return kind(override.value)
    except ValueError:
        raise UserError(f"{override.flag}: {override.key} takes a number ({kind.__name__}), not "
                        f"{override.value!r}") from None
