"""Every config.model key either changes what a family's model computes or is refused on it (docs/design.md: an
override takes effect or is refused). A family declares the keys its model leaves unread, always or in a mode
(bert_jax/families.py, bert_jax/models/unread.py); config validation refuses another value of those.

The matrix: each registered family, in each mode, is built and traced at micro shapes (jax.eval_shape, nothing
compiled) while every read of config.model (a ConfigDict) and of the model's frozen config dataclass is recorded.
A key of the family's configs that nothing read must be one the family declares unread in that mode, and a declared
one must be unread: a new key, family or mode that misses its declaration fails here.
"""
import contextlib
import dataclasses
import importlib
import pathlib

import jax
import ml_collections
import pytest

import bert_jax
from bert_jax.configs import base, modernbert_base
from bert_jax.families import get_family, known_families
from bert_jax.models.unread import unread_keys
from bert_jax.train.config_validation import validate_config
from test_family_conformance import MICRO, padded_batch

# Keys read outside the model, by design: the registry (family), the config check's own output (mup_multipliers),
# the data's length bound and the Hugging Face export (max_position_embeddings, which a family with relative or
# rotary positions never reads), and the tokenizer check and the export (pad_token_id).
READ_ELSEWHERE = {"family", "mup_multipliers", "max_position_embeddings", "pad_token_id"}
# The modes that switch a model's code path, at a value other than the default. μP reads mup_base_width, which the
# default (standard) leaves unread; an unrolled stack leaves the scanned loop's keys unread, a hidden dropout rate
# of 0 the fused dropout-and-norm.
MODES = {"default": {}, "per_step": {"dropout_masks": "per_step"}, "unrolled": {"scan_layers": False},
         "no_dropout": {"dropout_rate": 0.0},
         "mup": {"parametrization": "mup", "mup_base_width": MICRO["hidden_size"] // 2}}
CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


@contextlib.contextmanager
def recording_reads(reads: set, classes):
    """Records in `reads` the keys read from any ConfigDict (by key, attribute or get) and the fields read from
    instances of the dataclasses `classes` (the model's config and its bases), except wholesale: items(), hashing,
    equality, repr and dataclasses.replace touch every key and read none for its own sake."""
    wholesale = [0]

    def whole(function):
        def wrapped(*args, **kwargs):
            wholesale[0] += 1
            try:
                return function(*args, **kwargs)
            finally:
                wholesale[0] -= 1
        return wrapped

    def read_key(get):
        def read(self, key):
            if not wholesale[0]:
                reads.add(key)
            return get(self, key)
        return read

    def read_field(get, fields):
        def read(self, name):
            if name in fields and not wholesale[0]:
                reads.add(name)
            return get(self, name)
        return read

    patched = [(ml_collections.ConfigDict, "__getitem__", read_key(ml_collections.ConfigDict.__getitem__)),
               (ml_collections.ConfigDict, "items", whole(ml_collections.ConfigDict.items)),
               (dataclasses, "replace", whole(dataclasses.replace))]
    for cls in classes:
        fields = {f.name for f in dataclasses.fields(cls)}
        patched.append((cls, "__getattribute__", read_field(cls.__getattribute__, fields)))
        patched += [(cls, name, whole(getattr(cls, name))) for name in ("__hash__", "__eq__", "__repr__")]
    saved = [(owner, name, owner.__dict__.get(name)) for owner, name, _ in patched]
    try:
        for owner, name, value in patched:
            setattr(owner, name, value)
        yield
    finally:
        for owner, name, value in reversed(saved):
            if value is None:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def family_model_keys() -> dict[str, dict]:
    """Per family, the model keys (and values) of configs/base.py and of every config of that family."""
    keys = {name: base.get_config().model.to_dict() for name in known_families()}
    for file in sorted(CONFIGS.glob("*.py")):
        if file.stem in ("__init__", "base"):
            continue
        model = importlib.import_module(f"bert_jax.configs.{file.stem}").get_config().model.to_dict()
        keys[model["family"]] = {**model, **keys[model["family"]]}
    return keys


KEYS = family_model_keys()


def model_config(family: str, mode: dict) -> ml_collections.ConfigDict:
    """The family's keys at micro sizes (its model's defaults for its own keys), with dropout on (the fused paths run
    only with it), in `mode`."""
    built = get_family(family).build_model(ml_collections.ConfigDict(dict(MICRO, family=family))).config
    own = {f.name: getattr(built, f.name) for f in dataclasses.fields(built)
           if f.name in KEYS[family] and f.name not in base.get_config().model}
    values = {**KEYS[family], **own, **{k: v for k, v in MICRO.items() if k in KEYS[family]}}
    values.update({"family": family, "dtype": "float32", "dropout_rate": 0.1, **mode})
    return ml_collections.ConfigDict(values)


def read_keys(family: str, model_cfg) -> set:
    """The config.model keys the family reads as its objective and model are built and traced in training."""
    family = get_family(family)
    classes = [c for c in type(family.build_model(model_cfg).config).__mro__ if dataclasses.is_dataclass(c)]
    reads: set = set()
    with recording_reads(reads, classes):
        family.objective_for(model_cfg)
        model = family.build_model(model_cfg)
        rngs = {name: jax.random.key(i) for i, name in enumerate(("params", "dropout", "sample"))}
        jax.eval_shape(lambda: model.init(rngs, padded_batch(), deterministic=False))
    return reads


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", known_families())
def test_every_model_key_is_read_or_declared_unread(family, mode):
    model_cfg = model_config(family, MODES[mode])
    declared = unread_keys(model_cfg, get_family(family).unread)
    if any(key in declared for key in MODES[mode]):
        pytest.skip(f"{family} refuses the mode {MODES[mode]} itself")
    unread = set(KEYS[family]) - read_keys(family, model_cfg) - READ_ELSEWHERE
    assert unread == set(declared), (f"family {family!r}, mode {mode}: read by nothing but not declared unread: "
                                     f"{sorted(unread - set(declared))}; declared unread but read: "
                                     f"{sorted(set(declared) - unread)}")


@pytest.mark.parametrize("family", known_families())
def test_a_declared_unread_key_does_nothing_at_configs_base_value(family):
    defaults = base.get_config().model
    for entry in get_family(family).unread:
        for key, inert in entry.keys:
            assert defaults[key] == inert, f"{family}: {key} declared unread at {inert!r}, configs/base.py has it at " \
                                           f"{defaults[key]!r}"


@pytest.mark.parametrize("key, value, names", [
    ("fused_qkv", True, "config.model.fused_qkv=True does nothing on family 'modernbert'"),
    ("fused_dropout_norm", True, "config.model.fused_dropout_norm=True does nothing on family 'modernbert'"),
    ("type_vocab_size", 1, "config.model.type_vocab_size=1 does nothing on family 'modernbert'"),
])
def test_a_key_the_family_leaves_unread_is_refused_naming_it(key, value, names):
    c = modernbert_base.get_config("tiny")
    c.model[key] = value
    with pytest.raises(bert_jax.UserError) as refused:
        validate_config(c)
    assert str(refused.value).startswith(names) and "\n" not in str(refused.value)


def test_a_key_a_mode_leaves_unread_is_refused_naming_both():
    from bert_jax.configs import tiny

    c = tiny.get_config()
    c.model.dropout_rate = 0.1  # tiny's 0 leaves no dropout to fuse: refused too (below)
    c.model.dropout_masks, c.model.fused_dropout_norm = "per_step", True
    with pytest.raises(bert_jax.UserError, match=r"config.model.fused_dropout_norm=True does nothing under "
                                                 r"config.model.dropout_masks='per_step'"):
        validate_config(c)
    c.model.dropout_masks = "per_layer"
    validate_config(c)  # the fused path runs: accepted


@pytest.mark.parametrize("mode, key, value, names", [
    ({"scan_layers": False}, "scan_unroll", 2,
     "config.model.scan_unroll=2 does nothing under config.model.scan_layers=False (family 'bert')"),
    ({"scan_layers": False}, "unroll_on_gpu", False,
     "config.model.unroll_on_gpu=False does nothing under config.model.scan_layers=False (family 'bert')"),
    ({}, "mup_base_width", 32,
     "config.model.mup_base_width=32 does nothing under config.model.parametrization='standard' (family 'bert')"),
    ({"dropout_rate": 0.0}, "fused_dropout_norm", True,
     "config.model.fused_dropout_norm=True does nothing under config.model.dropout_rate=0.0 (family 'bert')"),
], ids=["scan_unroll", "unroll_on_gpu", "mup_base_width", "fused_dropout_norm"])
def test_a_key_a_shared_mode_leaves_unread_is_refused_naming_both(mode, key, value, names):
    from bert_jax.configs import tiny

    c = tiny.get_config()
    c.model.update(mode)
    validate_config(c)  # the mode alone: accepted
    c.model[key] = value
    with pytest.raises(bert_jax.UserError) as refused:
        validate_config(c)
    assert str(refused.value).startswith(names) and "\n" not in str(refused.value)
