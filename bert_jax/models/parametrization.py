"""μP (Yang et al. 2021, Tensor Programs V) for every family: a table of multipliers by a parameter's role.

Under the standard parametrization the best learning rate moves as a model widens, so a sweep must be paid for
at full size. Under μP (config.model.parametrization="mup") it holds across widths: sweep at a small width, train
the wide model with the rate found. `config.model.mup_base_width` is the hidden size at which μP equals standard;
the width multiplier is m = hidden_size / mup_base_width.

A parameter's role comes from its shape, as microsoft/mup's `set_base_shapes` finds it: the family's module is
built a second time with its width keys (`ParamRoles.width_keys`) doubled, and an axis whose size changed is a
width axis (a scanned stack's layer axis never is). Then, for Adam (TP5, Table 3):

    role      what                                                       init std   learning rate
    finite    no width axis (a position table of a factorised           x 1        x 1
              embedding, the NSP bias)
    vector    one width axis, as output: embeddings, norms, biases,     x 1        x 1
              input projections
    hidden    two width axes (fan-in and fan-out grow): attention,      x m^-1/2   x 1/m
              feed-forward, transforms, the pooler
    readout   a width axis as input only (the NSP/SOP/RTD outputs), or  x 1/m      x 1/m
              the norm feeding a tied decoder (`ParamRoles.readout_inputs`)

The readout row is μP's output multiplier 1/m. mutransformers puts it on the tied decoder's input
(`MuSharedReadout`: decoder(x / m)); here the head norm just before the decoder carries it, initialised and
updated x 1/m: the same function of the same Adam steps as a norm initialised at 1 whose output is divided by m,
so a checkpoint's weights already hold it and an export has nothing to fold for it. Untied readouts take it the
same way (initialised and updated x 1/m, as TP5's table writes μP for Adam).

The attention logits are the one multiplier in the forward pass: q.k / d_head rather than / sqrt(d_head),
normalised to equal standard at the base width (`attention_multiplier`, applied in bert_jax/models/attention.py). An export folds it
into the query projection (`fold_attention`), so a plain transformers model computes the same logits.

Under "standard" nothing here runs: the init, the optimizer and the attention are bit-identical to a run before μP.
"""
import dataclasses
import fnmatch
import math

import jax
import numpy as np
from flax.linen import meta

from bert_jax.models.param_roles import ParamRoles

PARAMETRIZATIONS = ("standard", "mup")

# role -> (init std, learning rate), each as a power of the width multiplier m.
MUP_RULES = {"finite": (0.0, 0.0), "vector": (0.0, 0.0), "hidden": (-0.5, -1.0), "readout": (-1.0, -1.0)}


def is_mup(model_cfg) -> bool:
    return model_cfg.get("parametrization", "standard") == "mup"


def check(model_cfg) -> None:
    """config.model.parametrization and mup_base_width, refused in one line naming the key."""
    name, base = model_cfg.get("parametrization", "standard"), model_cfg.get("mup_base_width", 0)
    if name not in PARAMETRIZATIONS:
        raise ValueError(f"config.model.parametrization={name!r}; expected one of {', '.join(PARAMETRIZATIONS)}")
    if name != "mup":
        return
    hidden, heads = model_cfg["hidden_size"], model_cfg["num_heads"]
    if base < 1 or hidden % base or base % heads:
        raise ValueError(f"config.model.mup_base_width={base} must divide config.model.hidden_size={hidden} and be "
                         f"a multiple of config.model.num_heads={heads} (the base head size is base / heads; the "
                         f"width grows with the head size, heads fixed)")


def width_multiplier(model_cfg) -> float:
    """m = hidden_size / mup_base_width under μP; 1 under standard."""
    return model_cfg["hidden_size"] / model_cfg["mup_base_width"] if is_mup(model_cfg) else 1.0


def widened(model_cfg, roles: ParamRoles) -> dict:
    """config.model with its width keys doubled: the second model whose shapes tell the width axes."""
    return {**dict(model_cfg), **{key: 2 * model_cfg[key] for key in roles.width_keys if key in model_cfg}}


def _keys(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", k)) for k in path)


def role_of(path: tuple[str, ...], shape, wide_shape, roles: ParamRoles) -> str:
    """A parameter's μP role from its shape at the model's width and at twice it (see the module's table)."""
    width_axes = [i for i, (a, b) in enumerate(zip(shape, wide_shape)) if a != b]
    if not width_axes:
        return "finite"
    if any(fnmatch.fnmatchcase(name, p) for name in path for p in roles.readout_inputs):
        return "readout"
    if len(width_axes) >= 2:
        return "hidden"
    # One width axis: the last is an output feature (a table's row, a bias, an input projection's output); any
    # other is contracted (a kernel's fan-in, its outputs fixed: a readout).
    return "vector" if width_axes[0] == len(shape) - 1 else "readout"


@dataclasses.dataclass(frozen=True)
class Multipliers:
    """A model's μP multipliers: trees shaped like its params (python floats), and the role of each leaf."""

    width: float  # m
    roles: dict  # path tree of role names
    init: dict  # x on the initial values
    learning_rate: dict  # x on the Adam update (before weight decay: lr x decay is kept, as mup's MuAdam)

    def summary(self) -> dict[str, str]:
        """role -> 'init std x a, learning rate x b: N tensors', for the roles present (show-config prints it)."""
        counts: dict[str, int] = {}
        for role in jax.tree.leaves(self.roles):
            counts[role] = counts.get(role, 0) + 1
        lines = {}
        for role, (init_power, lr_power) in MUP_RULES.items():
            if role in counts:
                lines[role] = (f"init std x {self.width ** init_power:.6g}, learning rate x "
                               f"{self.width ** lr_power:.6g}: {counts[role]} tensors")
        return lines


def multipliers(model_cfg, params, wide_params, roles: ParamRoles) -> Multipliers:
    """The multipliers for `params` (the model's abstract params), whose shapes at twice the width are
    `wide_params` (see `widened`)."""
    m = width_multiplier(model_cfg)
    role_tree = jax.tree_util.tree_map_with_path(
        lambda path, p, w: role_of(_keys(path), p.shape, w.shape, roles), params, wide_params)
    init = jax.tree.map(lambda role: m ** MUP_RULES[role][0], role_tree)
    lr = jax.tree.map(lambda role: m ** MUP_RULES[role][1], role_tree)
    return Multipliers(m, role_tree, init, lr)


def scale_tree(params, factors):
    """params x factors leaf by leaf (a factor of 1 leaves the leaf as it is); `params` may be boxed
    (nn.LogicallyPartitioned), `factors` a tree of floats shaped like them."""
    def scale(factor, leaf):
        if factor == 1.0:
            return leaf
        if isinstance(leaf, meta.AxisMetadata):
            return leaf.replace_boxed(leaf.value * np.asarray(factor, leaf.value.dtype))
        return leaf * np.asarray(factor, leaf.dtype)

    return jax.tree.map(scale, factors, params, is_leaf=lambda x: isinstance(x, meta.AxisMetadata))


def fold_attention(params, factor: float, roles: ParamRoles):
    """params with the query projection (kernel and bias; `ParamRoles.query_slice` of a fused QKV) times
    `factor`: the attention-logit multiplier folded into weights (export), or taken out of them (1/factor, an
    import into a μP run). q enters every logit term linearly (q.k, and DeBERTa's shared query projection of the
    positions), so the logits are multiplied by it."""
    if factor == 1.0:
        return params

    def fold(path, leaf):
        keys = _keys(path)
        if not any(fnmatch.fnmatchcase(name, p) for name in keys for p in roles.query):
            return leaf
        array = np.array(leaf, dtype=np.asarray(leaf).dtype)
        if roles.query_slice is None:
            return array * np.asarray(factor, array.dtype)
        axis, index = roles.query_slice
        view = [slice(None)] * array.ndim
        view[axis] = index
        array[tuple(view)] *= np.asarray(factor, array.dtype)
        return array

    return jax.tree_util.tree_map_with_path(fold, params)


def attention_multiplier(model_cfg) -> float:
    """The μP factor on the attention logits: sqrt(base head size / head size) (1/d_head scaling, equal to standard
    at the base width); 1 under standard. A family's model config carries it (`attention_multiplier`), and
    bert_jax/models/attention.py applies it to every kernel's logits."""
    return math.sqrt(model_cfg["mup_base_width"] / model_cfg["hidden_size"]) if is_mup(model_cfg) else 1.0
