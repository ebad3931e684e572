"""Data mixtures as configuration: named sources with weights, and weights that change by step.

    c.data.mixture = dict(
        books=dict(source="text", path="gs://b/books/*.txt", weight=0.7),
        web=dict(source="jsonl", path="gs://b/web/*.jsonl.gz", weight=0.3),
    )
    c.data.mixture_schedule = ((5000, dict(books=0.1, web=0.9)),)  # from step 5000 on
    c.data.mixture.books.on_exhausted = "stop"  # the run ends when books has been read once

A source is any source kind `documents.py` reads (text, jsonl, parquet, tfds, prepared,
embedded), with its own keys among SOURCE_KEYS; a key it does not set is config.data's. Its
`weight` is relative (0.7/0.3 and 7/3 mix alike). Its `on_exhausted` says what its end does:
"repeat" (the default) starts its next epoch, counted per source (data/<name>/epochs); "stop"
ends the run at the last batch before the source's second epoch (mixing.SourceCountingIterator,
and the harness ends the loop there as a finished run ends). A schedule stage `(step, {name: weight})`
holds from that step's batch on (the batch of step `step + 1` is the first); a source a stage
does not name has weight 0 in it. This module turns the config into one config.data per
source (`source_configs`) and checks it (`check_mixture`); data_pipelines/loader/mixing.py
mixes the sources' example streams.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

import ml_collections

from data_pipelines.sources import documents as sources

# The config.data keys a source may set for itself (plus `weight`); the rest are shared.
SOURCE_KEYS = ("source", "path", "field", "tfds_name", "tfds_split", "tfds_data_dir", "segmenter",
               "max_line_bytes", "eval_fraction", "shard_cache_bytes")
MIXTURE_KEYS = ("weight", "on_exhausted")  # a source's keys that are no config.data key
ON_EXHAUSTED = ("repeat", "stop")
_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # a name becomes a metric key: data/<name>/sequences


def has_mixture(data_cfg) -> bool:
    """Whether config.data names a mixture (config.data.mixture non-empty)."""
    return bool(data_cfg.get("mixture"))


def _items(value) -> list[tuple]:
    """A dict or ConfigDict as (key, value) pairs; anything else is a config error."""
    if isinstance(value, (Mapping, ml_collections.ConfigDict)):
        return list(value.items())
    raise ValueError(f"expected a dict, got {type(value).__name__} {value!r}")


def source_names(data_cfg) -> tuple[str, ...]:
    """The sources' names, sorted: a source's index (in a batch's `source_ids`) is its place here."""
    return tuple(sorted(name for name, _ in _items(data_cfg.mixture)))


def source_seed(name: str) -> int:
    """A number drawn from a source's name, so a source's order does not move when others are added."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def source_configs(data_cfg) -> dict[str, ml_collections.ConfigDict]:
    """name -> a config.data of one source (no mixture): the shared keys with the source's own set."""
    base = ml_collections.ConfigDict(data_cfg.to_dict())
    base.mixture = ml_collections.ConfigDict()
    base.mixture_schedule = ()
    out = {}
    for name, spec in sorted(_items(data_cfg.mixture)):
        cfg = base.copy_and_resolve_references()
        for key, value in _items(spec):
            if key not in MIXTURE_KEYS:
                cfg[key] = value
        out[name] = cfg
    return out


def weights(data_cfg) -> tuple[float, ...]:
    """The sources' own weights (before any schedule stage), normalised, in source_names order."""
    raw = [float(dict(_items(spec))["weight"]) for _, spec in sorted(_items(data_cfg.mixture))]
    return tuple(w / sum(raw) for w in raw)


def stages(data_cfg) -> tuple[tuple[int, tuple[float, ...]], ...]:
    """((first batch index, normalised weights in source_names order), ...): stage 0 is the sources' weights."""
    names = source_names(data_cfg)
    out = [(0, weights(data_cfg))]
    for step, stage in data_cfg.get("mixture_schedule", ()) or ():
        given = dict(_items(stage))
        raw = [float(given.get(name, 0.0)) for name in names]
        out.append((int(step), tuple(w / sum(raw) for w in raw)))
    return tuple(out)


def stopping_sources(data_cfg) -> tuple[str, ...]:
    """The sources whose end ends the run (on_exhausted="stop"), in source_names order."""
    if not has_mixture(data_cfg):
        return ()
    return tuple(name for name, spec in sorted(_items(data_cfg.mixture))
                 if dict(_items(spec)).get("on_exhausted", "repeat") == "stop")


def _check_weight(key: str, value) -> float:
    try:
        weight = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key}={value!r} is not a number") from None
    if not weight >= 0:  # also NaN
        raise ValueError(f"{key}={value!r} must be >= 0")
    return weight


def check_mixture(data_cfg) -> None:
    """Fails, naming the key, on a mixture that cannot run: names, keys, weights, schedule, each source.

    Weights that are negative or all zero, an on_exhausted not in ON_EXHAUSTED, a schedule stage naming an unknown source or whose
    steps do not increase, a source key that is not one of SOURCE_KEYS, and a source that
    cannot be read (unknown kind, a path matching nothing) each fail here, before any compile.
    """
    if not has_mixture(data_cfg):
        if data_cfg.get("mixture_schedule"):
            raise ValueError("config.data.mixture_schedule is set but config.data.mixture is empty")
        return
    try:
        specs = _items(data_cfg.mixture)
    except ValueError as e:
        raise ValueError(f"config.data.mixture: {e}") from None
    names = set()
    total = 0.0
    for name, spec in specs:
        key = f"config.data.mixture.{name}"
        if not _NAME.fullmatch(name):
            raise ValueError(f"{key}: a source name may hold only letters, digits, '_', '.' and '-'")
        try:
            fields = dict(_items(spec))
        except ValueError as e:
            raise ValueError(f"{key}: {e}") from None
        unknown = sorted(set(fields) - set(SOURCE_KEYS) - set(MIXTURE_KEYS))
        if unknown:
            raise ValueError(f"{key} sets {unknown}, which a source cannot set; its keys: "
                             f"{MIXTURE_KEYS + SOURCE_KEYS}")
        if fields.get("on_exhausted", "repeat") not in ON_EXHAUSTED:
            raise ValueError(f"{key}.on_exhausted={fields['on_exhausted']!r} is not one of {ON_EXHAUSTED}")
        for needed in ("source", "weight"):
            if needed not in fields:
                raise ValueError(f"{key}.{needed} is missing (every source needs `source` and `weight`)")
        total += _check_weight(f"{key}.weight", fields["weight"])
        names.add(name)
    if total <= 0:
        raise ValueError("config.data.mixture: every source's weight is 0; give at least one a positive weight")
    last = 0
    for i, stage in enumerate(data_cfg.get("mixture_schedule", ()) or ()):
        key = f"config.data.mixture_schedule[{i}]"
        try:
            step, stage_weights = stage
            given = dict(_items(stage_weights))
        except (TypeError, ValueError):
            raise ValueError(f"{key}={stage!r}: a stage is (step, dict(name=weight, ...))") from None
        if not isinstance(step, int) or step <= last:
            raise ValueError(f"{key}: step {step!r} must be an integer above the stage before's ({last}); "
                             "stages go forward in steps")
        last = step
        unknown = sorted(set(given) - names)
        if unknown:
            raise ValueError(f"{key} names {unknown}, which config.data.mixture does not hold "
                             f"(its sources: {sorted(names)})")
        if sum(_check_weight(f"{key}[{name!r}]", w) for name, w in given.items()) <= 0:
            raise ValueError(f"{key}: every weight of the stage is 0")
    for name, cfg in source_configs(data_cfg).items():
        try:
            sources.check_source(cfg)
        except (ValueError, FileNotFoundError) as e:
            # The source's own keys: config.data.path -> config.data.mixture.<name>.path.
            raise type(e)(str(e).replace("config.data.", f"config.data.mixture.{name}.")) from None


def storage_paths(data_cfg) -> dict[str, str]:
    """'config.data.mixture.<name>.path' -> path, for the storage preflight (harness.check_storage)."""
    if not has_mixture(data_cfg):
        return {}
    return {f"config.data.mixture.{name}.path": cfg.get("path", "")
            for name, cfg in source_configs(data_cfg).items()}
