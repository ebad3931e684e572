"""BERT parameters <-> Hugging Face `BertForPreTraining` state dicts and config.json.

Pure functions on numpy arrays: no files, no torch. The names and layouts are those
of `transformers.BertForPreTraining`; torch `Linear` weights are [out, in], the
transpose of our kernels, and our attention kernels keep heads as their own axis
(q/k/v: [embed, heads, head_dim], output: [heads, head_dim, embed]).

Scanned params (`encoder/stack/layers` with a leading layer axis) are unstacked on
export and stacked again on import when `config.model.scan_layers` is on.
"""
import dataclasses
from typing import Any

import flax.linen as nn
import numpy as np

from bert_jax.hf.converter import HfConverter
from bert_jax.hf.exported import HfExport
from bert_jax.models.scan_layout import SCANNED, stack_layers, unstack_layers

# Layouts: how one tensor goes between our shape and Hugging Face's.
COPY = "copy"  # same array
LINEAR = "linear"  # our [in, out] kernel is torch's [out, in] weight, transposed
HEADS_IN = "heads_in"  # q/k/v kernel [embed, heads, head_dim] <-> weight [heads*head_dim, embed]
HEADS_BIAS = "heads_bias"  # q/k/v bias [heads, head_dim] <-> [heads*head_dim]
HEADS_OUT = "heads_out"  # output kernel [heads, head_dim, embed] <-> weight [embed, heads*head_dim]
# Fused projections (ModernBERT): kernel [embed, parts, ...] <-> weight [parts*..., embed], bias [parts, ...] <-> flat.
QKV_IN = "qkv_in"  # [embed, 3, heads, head_dim]
QKV_BIAS = "qkv_bias"  # [3, heads, head_dim]
GLU_IN = "glu_in"  # [embed, 2, intermediate]: GeGLU's input and gate halves
GLU_BIAS = "glu_bias"  # [2, intermediate]

# Parts of the model: an `encoder` tensor must be in every checkpoint we import; a
# `head` tensor (pooler, MLM, NSP) may be absent, as in BertModel-only checkpoints.
ENCODER, HEAD = "encoder", "head"

# Tensors Hugging Face keeps but derives from others, written on export for loaders
# that do not tie weights themselves: HF name -> the HF name it equals.
TIED_ON_EXPORT = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
# Buffers, not weights: present in some checkpoints, never needed.
IGNORED_ON_IMPORT = ("bert.embeddings.position_ids",)
# Tensors indexed by token id, by folder ("": the main one), for extend-vocab (checkpoint/vocab_rows.py): the word
# embeddings first, then the tied decoder and the MLM output bias.
VOCAB_TENSORS = {"": ("bert.embeddings.word_embeddings.weight", *TIED_ON_EXPORT, "cls.predictions.bias")}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    hf_name: str
    path: tuple[str, ...]  # where the tensor lives in our (unrolled) params
    layout: str
    hf_shape: tuple[int, ...]
    part: str


def add_tensor(specs: list, hf_name: str, path: str, layout: str, hf_shape, part: str = ENCODER) -> None:
    specs.append(TensorSpec(hf_name, tuple(path.split("/")), layout, tuple(hf_shape), part))


def add_norm(specs: list, hf_prefix: str, path: str, size: int, part: str = ENCODER) -> None:
    add_tensor(specs, f"{hf_prefix}.weight", f"{path}/norm/scale", COPY, (size,), part)
    add_tensor(specs, f"{hf_prefix}.bias", f"{path}/norm/bias", COPY, (size,), part)


def add_dense(specs: list, hf_prefix: str, path: str, layout: str, hf_shape, part: str = ENCODER) -> None:
    add_tensor(specs, f"{hf_prefix}.weight", f"{path}/kernel", layout, hf_shape, part)
    bias_layout = HEADS_BIAS if layout == HEADS_IN else COPY
    add_tensor(specs, f"{hf_prefix}.bias", f"{path}/bias", bias_layout, hf_shape[:1], part)


def encoder_specs(model_cfg, prefix: str) -> list[TensorSpec]:
    """The embeddings and layers of a BertEncoder (`encoder/...`) under HF's `{prefix}.` (bert, roberta)."""
    h, i_size = model_cfg.hidden_size, model_cfg.intermediate_size
    specs = []
    emb = "encoder/embeddings"
    add_tensor(specs, f"{prefix}.embeddings.word_embeddings.weight", f"{emb}/word/embedding", COPY,
               (model_cfg.vocab_size, h))
    add_tensor(specs, f"{prefix}.embeddings.position_embeddings.weight", f"{emb}/position/embedding", COPY,
               (model_cfg.max_position_embeddings, h))
    add_tensor(specs, f"{prefix}.embeddings.token_type_embeddings.weight", f"{emb}/token_type/embedding", COPY,
               (model_cfg.type_vocab_size, h))
    add_norm(specs, f"{prefix}.embeddings.LayerNorm", f"{emb}/norm", h)
    add_layer_stack(specs, f"{prefix}.encoder.layer", "encoder/stack", model_cfg.num_layers, h, i_size)
    return specs


def add_layer_stack(specs: list, hf_prefix: str, path: str, num_layers: int, h: int, i_size: int) -> None:
    """The post-LN TransformerStack at `path` as Hugging Face's BertLayer list `{hf_prefix}.{i}` (BERT,
    RoBERTa and ELECTRA name them alike)."""
    for layer in range(num_layers):
        hf, ours = f"{hf_prefix}.{layer}", f"{path}/{SCANNED}_{layer}"
        for name in ("query", "key", "value"):
            add_dense(specs, f"{hf}.attention.self.{name}", f"{ours}/attention/{name}", HEADS_IN, (h, h))
        add_dense(specs, f"{hf}.attention.output.dense", f"{ours}/attention/output", HEADS_OUT, (h, h))
        add_norm(specs, f"{hf}.attention.output.LayerNorm", f"{ours}/attention_norm", h)
        add_dense(specs, f"{hf}.intermediate.dense", f"{ours}/intermediate", LINEAR, (i_size, h))
        add_dense(specs, f"{hf}.output.dense", f"{ours}/mlp_output", LINEAR, (h, i_size))
        add_norm(specs, f"{hf}.output.LayerNorm", f"{ours}/mlp_norm", h)


def tensor_specs(model_cfg) -> list[TensorSpec]:
    """Every tensor of a BertForPreTraining with `config.model`'s sizes, in Hugging Face order."""
    h, v = model_cfg.hidden_size, model_cfg.vocab_size
    specs = encoder_specs(model_cfg, "bert")
    add_dense(specs, "bert.pooler.dense", "pooler", LINEAR, (h, h), HEAD)
    add_dense(specs, "cls.predictions.transform.dense", "mlm_transform", LINEAR, (h, h), HEAD)
    add_norm(specs, "cls.predictions.transform.LayerNorm", "mlm_norm", h, HEAD)
    add_tensor(specs, "cls.predictions.bias", "mlm_output_bias", COPY, (v,), HEAD)
    add_dense(specs, "cls.seq_relationship", "nsp", LINEAR, (2, h), HEAD)
    return specs


def _to_hf(array: np.ndarray, layout: str) -> np.ndarray:
    if layout == COPY:
        return array
    if layout == LINEAR:
        return array.T
    if layout in (HEADS_IN, QKV_IN, GLU_IN):
        return array.reshape(array.shape[0], -1).T
    if layout in (HEADS_BIAS, QKV_BIAS, GLU_BIAS):
        return array.reshape(-1)
    if layout == HEADS_OUT:
        return array.reshape(-1, array.shape[-1]).T
    raise ValueError(f"unknown layout {layout!r}")


def _from_hf(array: np.ndarray, layout: str, num_heads: int) -> np.ndarray:
    if layout == COPY:
        return array
    if layout == LINEAR:
        return array.T
    if layout == HEADS_IN:
        return array.T.reshape(array.shape[1], num_heads, -1)
    if layout == HEADS_BIAS:
        return array.reshape(num_heads, -1)
    if layout == HEADS_OUT:
        return array.T.reshape(num_heads, -1, array.shape[0])
    if layout == QKV_IN:
        return array.T.reshape(array.shape[1], 3, num_heads, -1)
    if layout == QKV_BIAS:
        return array.reshape(3, num_heads, -1)
    if layout == GLU_IN:
        return array.T.reshape(array.shape[1], 2, -1)
    if layout == GLU_BIAS:
        return array.reshape(2, -1)
    raise ValueError(f"unknown layout {layout!r}")


def _get(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def specs_to_hf(params: dict, specs: list[TensorSpec], tied: dict[str, str]) -> dict[str, np.ndarray]:
    """Params (scanned or unrolled) -> HF state dict (float32, contiguous) by `specs`; `tied` HF names are
    written as copies of the names they equal."""
    params = unstack_layers(nn.meta.unbox(params))  # unbox: LogicallyPartitioned leaves straight from init
    state = {}
    for spec in specs:
        array = _to_hf(np.asarray(_get(params, spec.path), np.float32), spec.layout)
        if array.shape != spec.hf_shape:
            raise ValueError(f"params/{'/'.join(spec.path)} gives {spec.hf_name} shape {array.shape}, "
                             f"expected {spec.hf_shape} from config.model")
        state[spec.hf_name] = np.ascontiguousarray(array)
    for name, source in tied.items():
        state[name] = state[source].copy()
    return state


def params_to_hf(params: dict, model_cfg) -> dict[str, np.ndarray]:
    """Our BertForPreTraining params (scanned or unrolled) -> HF state dict (float32, contiguous)."""
    return specs_to_hf(params, tensor_specs(model_cfg), TIED_ON_EXPORT)


def normalise_hf_names(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """BertModel checkpoints name tensors without the `bert.` prefix; old TF ports say gamma/beta."""
    prefixed = any(k.startswith("bert.") for k in state)
    out = {}
    for name, array in state.items():
        if not prefixed and not name.startswith("cls."):
            name = f"bert.{name}"
        if name.endswith("LayerNorm.gamma"):
            name = name[: -len("gamma")] + "weight"
        elif name.endswith("LayerNorm.beta"):
            name = name[: -len("beta")] + "bias"
        out[name] = array
    return out


@dataclasses.dataclass
class ImportReport:
    """What an import left out: head tensors kept from `fallback_params`, and HF tensors not used."""

    kept_from_fallback: list[str]
    unused: list[str]


def specs_to_params(state: dict[str, np.ndarray], specs: list[TensorSpec], known: set[str], model_cfg,
                    fallback_params: dict | None = None) -> tuple[dict, ImportReport]:
    """HF state dict -> our params by `specs`, scanned if `model_cfg.scan_layers`; `known`: HF names that are
    not in `specs` but are expected (tied copies, buffers), so not reported unused.

    Head tensors the checkpoint lacks come from `fallback_params` (e.g. a fresh
    initialisation) when given; a missing encoder tensor, or any missing tensor without a
    fallback, or a tensor of the wrong shape, is a ValueError naming it.
    """
    fallback = None if fallback_params is None else unstack_layers(nn.meta.unbox(fallback_params))
    params, kept, missing = {}, [], []
    for spec in specs:
        if spec.hf_name not in state:
            if spec.part == HEAD and fallback is not None:
                _set(params, spec.path, np.asarray(_get(fallback, spec.path)))
                kept.append(spec.hf_name)
            else:
                missing.append(spec.hf_name)
            continue
        array = np.asarray(state[spec.hf_name])
        if array.shape != spec.hf_shape:
            raise ValueError(f"Hugging Face tensor {spec.hf_name} has shape {array.shape}, but config.model "
                             f"needs {spec.hf_shape}")
        _set(params, spec.path, _from_hf(array.astype(np.float32), spec.layout, model_cfg.num_heads))
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"the Hugging Face checkpoint lacks {len(missing)} tensor(s) the model needs: {shown}")
    unused = sorted(set(state) - {s.hf_name for s in specs} - known)
    if model_cfg.scan_layers:
        params = stack_layers(params)
    return params, ImportReport(kept_from_fallback=kept, unused=unused)


def hf_to_params(state: dict[str, np.ndarray], model_cfg, fallback_params: dict | None = None
                 ) -> tuple[dict, ImportReport]:
    """HF BERT state dict -> our params, scanned if `model_cfg.scan_layers`; see `specs_to_params`."""
    return specs_to_params(normalise_hf_names(state), tensor_specs(model_cfg),
                           set(TIED_ON_EXPORT) | set(IGNORED_ON_IMPORT), model_cfg, fallback_params)


# config.model key -> Hugging Face BertConfig key; these must agree on import.
CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size",
    "layer_norm_eps": "layer_norm_eps",
}


def config_json(model_cfg, keys: dict[str, str], **fields) -> dict[str, Any]:
    """A config.json for any family: the sizes `keys` names (ours -> HF), what every family shares, and `fields`."""
    out = {hf: model_cfg[ours] for ours, hf in keys.items()}
    out.update(
        hidden_dropout_prob=float(model_cfg.dropout_rate),
        attention_probs_dropout_prob=float(model_cfg.attention_dropout_rate),
        initializer_range=float(model_cfg.initializer_range),
        position_embedding_type="absolute",
        tie_word_embeddings=True,
        torch_dtype="float32",
        **fields,
    )
    return out


def hf_config(model_cfg, pad_token_id: int = 0) -> dict[str, Any]:
    """A Hugging Face config.json for `config.model` (exact erf GELU, absolute positions, post-LN)."""
    return config_json(model_cfg, CONFIG_KEYS, model_type="bert", architectures=["BertForPreTraining"],
                       hidden_act="gelu", pad_token_id=pad_token_id)


def read_config_values(hf_cfg: dict, *, model_type: str, family: str, keys: dict[str, str],
                       defaults: dict[str, Any], implemented: dict[str, tuple]) -> dict[str, Any]:
    """config.model values from a Hugging Face config.json, for any family; ValueError naming what we cannot run.

    keys: config.model key -> its name in config.json; defaults: values for the keys that
    config.json may omit (transformers' own defaults); implemented: config.json key -> the
    values this family implements, the first being transformers' default.
    """
    if hf_cfg.get("model_type") != model_type:
        raise ValueError(f"config.json model_type={hf_cfg.get('model_type')!r}: only {model_type!r} can be "
                         f"imported into config.model.family={family!r}")
    for key, allowed in implemented.items():
        if hf_cfg.get(key, allowed[0]) not in allowed:
            raise ValueError(f"config.json {key}={hf_cfg[key]!r}: the {family} family here implements only "
                             f"{', '.join(map(repr, allowed))}")
    missing = [hf for ours, hf in keys.items() if hf not in hf_cfg and ours not in defaults]
    if missing:
        raise ValueError(f"config.json lacks {missing}")
    return {ours: hf_cfg.get(hf, defaults.get(ours)) for ours, hf in keys.items()}


def model_config_from_hf(hf_cfg: dict) -> dict[str, Any]:
    """config.model values read from a Hugging Face BERT config.json."""
    return read_config_values(hf_cfg, model_type="bert", family="bert", keys=CONFIG_KEYS,
                              defaults={"layer_norm_eps": 1e-12},
                              implemented={"hidden_act": ("gelu",), "position_embedding_type": ("absolute",)})


def check_config_matches(hf_cfg: dict, model_cfg) -> None:
    """ValueError naming the first config.model key that disagrees with the HF config.json."""
    check_values_match(model_config_from_hf(hf_cfg), model_cfg, CONFIG_KEYS)


def check_values_match(values: dict, model_cfg, hf_names: dict[str, str]) -> None:
    """`values`: config.model key -> the value HF's config.json gives (named there `hf_names[key]`)."""
    for ours, value in values.items():
        if ours == "layer_norm_eps":
            close = np.isclose(value, model_cfg[ours], rtol=1e-6, atol=0)
        else:
            close = value == model_cfg.get(ours)
        if not close:
            raise ValueError(f"config.model.{ours}={model_cfg.get(ours)!r} but the Hugging Face config.json says "
                             f"{hf_names[ours]}={value!r}; set --config.model.{ours}={value!r}")


def hf_export(params: dict, model_cfg) -> HfExport:
    """The family hook: the HF state dict and config.json of our params."""
    return HfExport(params_to_hf(params, model_cfg), hf_config(model_cfg))


def hf_import(state: dict[str, np.ndarray], hf_cfg: dict, model_cfg, fallback_params: dict
              ) -> tuple[dict, ImportReport]:
    """The family hook: our params from an HF state dict, after checking its config fits `model_cfg`."""
    check_config_matches(hf_cfg, model_cfg)
    return hf_to_params(state, model_cfg, fallback_params)


CONVERTER = HfConverter(model_type="bert", to_hf=hf_export, from_hf=hf_import, model_config=model_config_from_hf,
                        vocab_tensors=VOCAB_TENSORS)
