"""Data mixtures as configuration: named sources with weights, and weights that change by step.

    c.data.mixture = dict(
        books=dict(source="text", path="gs://b/books/*.txt", weight=0.7),
        web=dict(source="jsonl", path="gs://b/web/*.jsonl.gz", weight=0.3),
    )
    c.data.mixture_schedule = ((5000, dict(books=0.1, web=0.9)),)  # from step 5000 on
    c.data.mixture.books.on_exhausted = "stop"  # the run ends when books has been read once

Or weights from the sources' sizes, sampled by temperature (XLM-R, Conneau et al. 2020, §3.1: alpha = 0.3;
mmBERT lowers alpha across its phases, 0.7 -> 0.5 -> 0.3): p_i = n_i ** alpha / sum_j n_j ** alpha, n_i the
documents source i holds (source_sizes.py: a prepared manifest's count, or a counting pass), alpha 1 the sizes'
own shares, 0 uniform:

    c.data.mixture = dict(en=dict(source="prepared", path="gs://b/en"), sw=dict(source="prepared", path="gs://b/sw"))
    c.data.mixture_alpha = 0.3
    c.data.mixture_alpha_schedule = ((80_000, 0.5),)  # alpha from step 80,000 on: a stage of its own

A source is any source kind `documents.py` reads (text, jsonl, parquet, tfds, prepared,
embedded), with its own keys among SOURCE_KEYS; a key it does not set is config.data's. Its
`weight` is relative (0.7/0.3 and 7/3 mix alike). Its `on_exhausted` says what its end does:
"repeat" (the default) starts its next epoch, counted per source (data/<name>/epochs); "stop"
ends the run at the last batch before the source's second epoch (mixing.SourceCountingIterator,
and the harness ends the loop there as a finished run ends). A schedule stage `(step, {name: weight})`
holds from that step's batch on (the batch of step `step + 1` is the first); a source a stage
does not name has weight 0 in it. Under `mixture_alpha` a source gives no `weight` (the sizes do; one that does is
refused, naming both keys), and `resolve_sizes` records each source's size in the run's config
(`config.data.mixture.<name>.size`, which a user may also set) and says the weights it makes, so the resolved config
holds what the run sampled by. This module turns the config into one config.data per
source (`source_configs`) and checks it (`check_mixture`); data_pipelines/loader/mixing.py
mixes the sources' example streams.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

import ml_collections

from data_pipelines.sources import documents as sources, source_sizes

# The config.data keys a source may set for itself (plus `weight`); the rest are shared.
SOURCE_KEYS = ("source", "path", "field", "tfds_name", "tfds_split", "tfds_data_dir", "segmenter",
               "max_line_bytes", "eval_fraction", "shard_cache_bytes")
MIXTURE_KEYS = ("weight", "on_exhausted", "size")  # a source's keys that are no config.data key
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


def by_temperature(data_cfg) -> bool:
    """Whether the sources' weights come from their sizes (config.data.mixture_alpha is set)."""
    return data_cfg.get("mixture_alpha") is not None


def temperature_weights(sizes, alpha: float) -> tuple[float, ...]:
    """p_i = n_i ** alpha / sum_j n_j ** alpha (XLM-R's multilingual sampling, Conneau et al. 2020, §3.1)."""
    powered = [float(n) ** float(alpha) for n in sizes]
    return tuple(p / sum(powered) for p in powered)


def sizes(data_cfg) -> tuple[int, ...]:
    """Each source's size in source_names order: its `size` where set (a resolved config sets all), else counted."""
    return tuple(int(dict(_items(spec)).get("size") or source_sizes.source_size(cfg)[0])
                 for (_, spec), cfg in zip(sorted(_items(data_cfg.mixture)), source_configs(data_cfg).values()))


def weights(data_cfg) -> tuple[float, ...]:
    """The sources' own weights (before any schedule stage), normalised, in source_names order; under
    mixture_alpha, the temperature weights of their sizes."""
    if by_temperature(data_cfg):
        return temperature_weights(sizes(data_cfg), data_cfg.mixture_alpha)
    raw = [float(dict(_items(spec))["weight"]) for _, spec in sorted(_items(data_cfg.mixture))]
    return tuple(w / sum(raw) for w in raw)


def stages(data_cfg) -> tuple[tuple[int, tuple[float, ...]], ...]:
    """((first batch index, normalised weights in source_names order), ...): stage 0 is the sources' weights;
    under mixture_alpha, each mixture_alpha_schedule entry is a stage of the sizes' weights at its alpha."""
    names = source_names(data_cfg)
    out = [(0, weights(data_cfg))]
    if by_temperature(data_cfg):
        counts = sizes(data_cfg)
        return tuple(out + [(int(step), temperature_weights(counts, alpha))
                            for step, alpha in data_cfg.get("mixture_alpha_schedule", ()) or ()])
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


def _check_alpha(key: str, value) -> float:
    alpha = _check_weight(key, value)
    if alpha == float("inf"):
        raise ValueError(f"{key}={value!r} must be finite (1: the sizes' own shares, 0: uniform, 0.3: XLM-R's)")
    return alpha


def _check_temperature(data_cfg, specs: list[tuple]) -> None:
    """mixture_alpha and its schedule: a number >= 0, no source weight beside it, no mixture_schedule, sizes >= 1."""
    _check_alpha("config.data.mixture_alpha", data_cfg.mixture_alpha)
    if data_cfg.get("mixture_schedule"):
        raise ValueError("config.data.mixture_schedule and config.data.mixture_alpha are both set: weights by step "
                         "or by the sources' sizes; for an alpha that changes by step, use "
                         "config.data.mixture_alpha_schedule=((step, alpha), ...)")
    for name, spec in specs:
        fields = dict(_items(spec))
        if "weight" in fields:
            raise ValueError(f"config.data.mixture.{name}.weight={fields['weight']!r} and config.data.mixture_alpha="
                             f"{data_cfg.mixture_alpha!r} are both set: under mixture_alpha the weights come from "
                             "the sources' sizes (p ~ n ** alpha); drop one")
        if "size" in fields and (isinstance(fields["size"], bool) or not isinstance(fields["size"], int)
                                 or fields["size"] < 1):
            raise ValueError(f"config.data.mixture.{name}.size={fields['size']!r} must be a whole number >= 1 (the "
                             "documents it holds; unset: counted)")
    last = 0
    for i, stage in enumerate(data_cfg.get("mixture_alpha_schedule", ()) or ()):
        key = f"config.data.mixture_alpha_schedule[{i}]"
        try:
            step, alpha = stage
        except (TypeError, ValueError):
            raise ValueError(f"{key}={stage!r}: a stage is (step, alpha)") from None
        if not isinstance(step, int) or step <= last:
            raise ValueError(f"{key}: step {step!r} must be an integer above the stage before's ({last}); "
                             "stages go forward in steps")
        _check_alpha(key, alpha)
        last = step


def check_mixture(data_cfg) -> None:
    """Fails, naming the key, on a mixture that cannot run: names, keys, weights, schedule, each source.

    Weights that are negative or all zero, an on_exhausted not in ON_EXHAUSTED, a schedule stage naming an unknown source or whose
    steps do not increase, a source key that is not one of SOURCE_KEYS, and a source that
    cannot be read (unknown kind, a path matching nothing) each fail here, before any compile. Under
    mixture_alpha: a source that sets a weight, a negative alpha, a mixture_schedule beside it, a size below 1.
    """
    if not has_mixture(data_cfg):
        for key in ("mixture_schedule", "mixture_alpha", "mixture_alpha_schedule"):
            if data_cfg.get(key) not in (None, (), []):
                raise ValueError(f"config.data.{key} is set but config.data.mixture is empty")
        return
    if data_cfg.get("mixture_alpha_schedule") and not by_temperature(data_cfg):
        raise ValueError("config.data.mixture_alpha_schedule is set but config.data.mixture_alpha is not: give "
                         "stage 0's alpha in mixture_alpha")
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
        if "source" not in fields:
            raise ValueError(f"{key}.source is missing (every source needs `source`)")
        if "weight" not in fields and not by_temperature(data_cfg):
            raise ValueError(f"{key}.weight is missing (every source needs a `weight`, or config.data.mixture_alpha "
                             "for weights from the sources' sizes)")
        if not by_temperature(data_cfg):
            total += _check_weight(f"{key}.weight", fields["weight"])
        names.add(name)
    if by_temperature(data_cfg):
        _check_temperature(data_cfg, specs)
    elif total <= 0:
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


def resolve_sizes(data_cfg, recorded: Mapping | None = None) -> list[str]:
    """Under mixture_alpha, sets each source's `size` in `data_cfg` (in place) where it is unset: the `recorded`
    one (a resume's config.json `data` section: no second counting pass over a corpus that cannot have changed
    without the run's data fingerprint saying so), else source_sizes.source_size. Returns the lines that say the
    sizes and the weights each stage samples by ([] without mixture_alpha)."""
    if not (has_mixture(data_cfg) and by_temperature(data_cfg)):
        return []
    check_mixture(data_cfg)  # the keys first, naming them, before a counting pass reads what they name
    recorded_sizes = {name: (spec or {}).get("size") for name, spec in ((recorded or {}).get("mixture") or {}).items()}
    how = {}
    for (name, spec), cfg in zip(sorted(_items(data_cfg.mixture)), source_configs(data_cfg).values()):
        if spec.get("size"):
            how[name] = "set"
        elif recorded_sizes.get(name):
            spec.size, how[name] = int(recorded_sizes[name]), "as the run recorded it"
        else:
            spec.size, how[name] = source_sizes.source_size(cfg)
    names = source_names(data_cfg)
    lines = [f"config.data.mixture.{name}.size -> {data_cfg.mixture[name].size} documents ({how[name]})"
             for name in names]
    for step, weights_ in stages(data_cfg):
        alpha = data_cfg.mixture_alpha if step == 0 else dict(data_cfg.mixture_alpha_schedule)[step]
        shares = ", ".join(f"{name} {w:.4f}" for name, w in zip(names, weights_))
        lines.append(f"config.data.mixture_alpha={alpha:g}{f' from step {step}' if step else ''} -> weights "
                     f"{shares} (p ~ size ** alpha)")
    return lines
