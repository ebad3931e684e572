"""ModernBERT parameters <-> Hugging Face `ModernBertForMaskedLM` state dicts and config.json.

HF names the encoder `model.` (embeddings.tok_embeddings, embeddings.norm, layers.i.{attn_norm,
attn.Wqkv, attn.Wo, mlp_norm, mlp.Wi, mlp.Wo}, final_norm), the head `head.dense`, `head.norm`,
and the decoder `decoder` (weight tied to the token embeddings, its own bias). Our layer 0 is
`encoder/first_layer` (it has no attn_norm), HF layer i > 0 is our `encoder/layers_{i-1}`.
Biases exist only where the config's attention_bias / mlp_bias / norm_bias /
classifier_bias / decoder_bias say. Pure functions on numpy arrays.

A causally trained run (config.model.objective='clm') exports as `ModernBertDecoderForCausalLM` (Ettin's decoders,
model_type "modernbert-decoder"): the same tensors, but Wqkv split into q_proj, k_proj and v_proj and the head named
`lm_head`; its config's `local_attention` is ours (the decoder looks back over local_attention // 2 tokens).
"""
import re
from typing import Any

import numpy as np

from bert_jax.hf.converter import HfConverter
from bert_jax.hf import bert as hf_bert
from bert_jax.hf.exported import HfExport
from bert_jax.hf.bert import (COPY, GLU_BIAS, GLU_IN, HEAD, HEADS_OUT, LINEAR, QKV_BIAS, QKV_IN,
                              ImportReport, TensorSpec, add_tensor)
from bert_jax.models.scan_layout import SCANNED
from bert_jax.objective_names import CAUSAL_LM, is_causal

PREFIX = "model"
TIED_ON_EXPORT = {"decoder.weight": f"{PREFIX}.embeddings.tok_embeddings.weight"}
MODEL_TYPE = "modernbert"
DECODER_MODEL_TYPE = "modernbert-decoder"
DECODER_ARCHITECTURE = "ModernBertDecoderForCausalLM"
# Tensors indexed by token id, by folder, for extend-vocab (checkpoint/vocab_rows.py): the word embeddings first.
VOCAB_TENSORS = {"": (f"{PREFIX}.embeddings.tok_embeddings.weight", *TIED_ON_EXPORT, "decoder.bias")}
# Why fine-tuned task heads do not export (families.py): ours have no LayerNorm before the classifier.
TASK_HEADS_MISSING = ("Hugging Face's ModernBert task classes run ModernBertPredictionHead (dense, activation, "
                      "LayerNorm) before every classifier, a head bert_jax.finetune does not train")

# config.model key -> HF ModernBertConfig key; these must agree on import.
CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
    "layer_norm_eps": "norm_eps",
    "hidden_act": "hidden_activation",
    "local_attention": "local_attention",
    "global_attn_every_n_layers": "global_attn_every_n_layers",
    "global_rope_theta": "global_rope_theta",
    "local_rope_theta": "local_rope_theta",
    "attention_bias": "attention_bias",
    "mlp_bias": "mlp_bias",
    "norm_bias": "norm_bias",
    "decoder_bias": "decoder_bias",
    "classifier_bias": "classifier_bias",
}
# transformers' defaults, for config.json files that omit a key.
HF_DEFAULTS = {
    "max_position_embeddings": 8192, "layer_norm_eps": 1e-5, "hidden_act": "gelu", "local_attention": 128,
    "global_attn_every_n_layers": 3, "global_rope_theta": 160_000.0, "local_rope_theta": 10_000.0,
    "attention_bias": False, "mlp_bias": False, "norm_bias": False, "decoder_bias": True, "classifier_bias": False,
}


def _get(model_cfg, key):
    return model_cfg.get(key, HF_DEFAULTS.get(key))


def _norm(specs, hf_prefix: str, path: str, size: int, bias: bool, part: str = hf_bert.ENCODER) -> None:
    add_tensor(specs, f"{hf_prefix}.weight", f"{path}/norm/scale", COPY, (size,), part)
    if bias:
        add_tensor(specs, f"{hf_prefix}.bias", f"{path}/norm/bias", COPY, (size,), part)


def _dense(specs, hf_prefix: str, path: str, layout: str, bias_layout: str, hf_shape, bias: bool,
           part: str = hf_bert.ENCODER) -> None:
    add_tensor(specs, f"{hf_prefix}.weight", f"{path}/kernel", layout, hf_shape, part)
    if bias:
        add_tensor(specs, f"{hf_prefix}.bias", f"{path}/bias", bias_layout, hf_shape[:1], part)


def tensor_specs(model_cfg) -> list[TensorSpec]:
    """Every tensor of a ModernBertForMaskedLM with `config.model`'s sizes (the tied decoder.weight aside)."""
    h, i_size, v = model_cfg.hidden_size, model_cfg.intermediate_size, model_cfg.vocab_size
    norm_bias, attn_bias, mlp_bias = (bool(_get(model_cfg, k)) for k in ("norm_bias", "attention_bias", "mlp_bias"))
    specs = []
    add_tensor(specs, f"{PREFIX}.embeddings.tok_embeddings.weight", "encoder/word/embedding", COPY, (v, h))
    _norm(specs, f"{PREFIX}.embeddings.norm", "encoder/embedding_norm", h, norm_bias)
    for layer in range(model_cfg.num_layers):
        hf = f"{PREFIX}.layers.{layer}"
        ours = "encoder/first_layer" if layer == 0 else f"encoder/{SCANNED}_{layer - 1}"
        if layer > 0:
            _norm(specs, f"{hf}.attn_norm", f"{ours}/attn_norm", h, norm_bias)
        _dense(specs, f"{hf}.attn.Wqkv", f"{ours}/Wqkv", QKV_IN, QKV_BIAS, (3 * h, h), attn_bias)
        _dense(specs, f"{hf}.attn.Wo", f"{ours}/attn_out", HEADS_OUT, COPY, (h, h), attn_bias)
        _norm(specs, f"{hf}.mlp_norm", f"{ours}/mlp_norm", h, norm_bias)
        _dense(specs, f"{hf}.mlp.Wi", f"{ours}/Wi", GLU_IN, GLU_BIAS, (2 * i_size, h), mlp_bias)
        _dense(specs, f"{hf}.mlp.Wo", f"{ours}/mlp_out", LINEAR, COPY, (h, i_size), mlp_bias)
    _norm(specs, f"{PREFIX}.final_norm", "encoder/final_norm", h, norm_bias)
    _dense(specs, "head.dense", "head_dense", LINEAR, COPY, (h, h), bool(_get(model_cfg, "classifier_bias")), HEAD)
    _norm(specs, "head.norm", "head_norm", h, norm_bias, HEAD)
    if _get(model_cfg, "decoder_bias"):
        add_tensor(specs, "decoder.bias", "mlm_output_bias", COPY, (v,), HEAD)
    return specs


def params_to_hf(params: dict, model_cfg):
    return hf_bert.specs_to_hf(params, tensor_specs(model_cfg), TIED_ON_EXPORT)


def hf_to_params(state, model_cfg, fallback_params: dict | None = None) -> tuple[dict, ImportReport]:
    """HF ModernBertForMaskedLM (or ModernBertModel: no `model.` prefix, no head) state dict -> our params; a
    ModernBertDecoderForCausalLM's (or ModernBertDecoderModel's) names are read as the encoder's first."""
    if not any(name.startswith(f"{PREFIX}.") for name in state):
        state = {name if name.startswith(("head.", "lm_head.", "decoder.")) else f"{PREFIX}.{name}": array
                 for name, array in state.items()}
    if any(".attn.q_proj." in name for name in state):
        state = encoder_state(state)
    return hf_bert.specs_to_params(state, tensor_specs(model_cfg), set(TIED_ON_EXPORT), model_cfg, fallback_params)


def layer_types(num_layers: int, every: int) -> list[str]:
    """HF's `layer_types`: layer i is global ("full_attention") when i % every == 0."""
    return ["sliding_attention" if i % every else "full_attention" for i in range(num_layers)]


def hf_config(model_cfg) -> dict[str, Any]:
    """A Hugging Face ModernBERT config.json for `config.model`."""
    out = {hf: _get(model_cfg, ours) for ours, hf in CONFIG_KEYS.items()}
    for key in ("global_attn_every_n_layers", "global_rope_theta", "local_rope_theta"):
        del out[key]  # transformers 5 spells them as layer_types and rope_parameters
    dropout, attention_dropout = float(model_cfg.dropout_rate), float(model_cfg.attention_dropout_rate)
    out.update(
        model_type=MODEL_TYPE, architectures=["ModernBertForMaskedLM"],
        layer_types=layer_types(model_cfg.num_layers, model_cfg.global_attn_every_n_layers),
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": float(_get(model_cfg, "global_rope_theta"))},
            "sliding_attention": {"rope_type": "default", "rope_theta": float(_get(model_cfg, "local_rope_theta"))},
        },
        classifier_activation=_get(model_cfg, "hidden_act"),
        embedding_dropout=dropout, mlp_dropout=dropout, attention_dropout=attention_dropout,
        initializer_range=float(model_cfg.initializer_range),
        initializer_cutoff_factor=float(model_cfg.get("initializer_cutoff_factor", 2.0)),
        # Our tokenizers put the specials first; the exported tokenizer files carry every id.
        pad_token_id=int(model_cfg.get("pad_token_id", 0)), bos_token_id=None, eos_token_id=None,
        cls_token_id=None, sep_token_id=None,
        tie_word_embeddings=True, torch_dtype="float32",
    )
    return out


def model_config_from_hf(hf_cfg: dict) -> dict[str, Any]:
    """config.model values read from a Hugging Face ModernBERT config.json (transformers 5 or older spellings), or
    a ModernBERT decoder's (Ettin's: the same keys; its `local_attention` is the encoder's window, as ours)."""
    if hf_cfg.get("model_type") not in (MODEL_TYPE, DECODER_MODEL_TYPE):
        raise ValueError(f"config.json model_type={hf_cfg.get('model_type')!r}: only {MODEL_TYPE!r} and "
                         f"{DECODER_MODEL_TYPE!r} can be imported into config.model.family='modernbert'")
    decoder = hf_cfg.get("model_type") == DECODER_MODEL_TYPE
    hf_cfg = dict(hf_cfg, model_type=MODEL_TYPE)
    rope = hf_cfg.get("rope_parameters") or {}
    for ours, kind in (("global_rope_theta", "full_attention"), ("local_rope_theta", "sliding_attention")):
        if "rope_theta" in (rope.get(kind) or {}):
            if rope[kind].get("rope_type", "default") != "default":
                raise ValueError(f"config.json rope_parameters.{kind}.rope_type={rope[kind]['rope_type']!r}: the "
                                 f"modernbert family here implements only 'default' rotary positions")
            hf_cfg[ours] = float(rope[kind]["rope_theta"])
    if hf_cfg.get("layer_types"):
        types = list(hf_cfg["layer_types"])
        every = next((i for i, t in enumerate(types) if i > 0 and t == "full_attention"), len(types))
        if types != layer_types(len(types), every):
            raise ValueError(f"config.json layer_types={types} is not one global layer every n: the modernbert "
                             f"family here implements only that pattern (global_attn_every_n_layers)")
        hf_cfg["global_attn_every_n_layers"] = every
    values = hf_bert.read_config_values(hf_cfg, model_type=MODEL_TYPE, family="modernbert", keys=CONFIG_KEYS,
                                        defaults=HF_DEFAULTS, implemented={"classifier_activation": ("gelu",)})
    return dict(values, objective=CAUSAL_LM) if decoder else values  # a decoder folder runs causally where read


_FUSED_QKV = re.compile(r"(model\.layers\.\d+\.attn)\.Wqkv\.(weight|bias)")


def decoder_state(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A ModernBertForMaskedLM state dict in ModernBertDecoderForCausalLM's names: Wqkv's rows (q, k, v, each
    heads x head_dim) as q_proj, k_proj, v_proj; `head.` as `lm_head.`; the rest as it is."""
    out = {}
    for name, array in state.items():
        fused = _FUSED_QKV.fullmatch(name)
        if fused:
            for part, rows in zip(("q_proj", "k_proj", "v_proj"), np.split(array, 3, axis=0), strict=True):
                out[f"{fused[1]}.{part}.{fused[2]}"] = rows
        else:
            out[f"lm_head.{name[len('head.'):]}" if name.startswith("head.") else name] = array
    return out


def encoder_state(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """decoder_state's inverse: q_proj, k_proj, v_proj stacked back into Wqkv, `lm_head.` as `head.`."""
    out = {}
    for name, array in state.items():
        if ".attn.q_proj." in name:
            parts = [state[name.replace(".q_proj.", f".{part}.")] for part in ("q_proj", "k_proj", "v_proj")]
            out[name.replace(".q_proj.", ".Wqkv.")] = np.concatenate(parts, axis=0)
        elif ".attn.k_proj." not in name and ".attn.v_proj." not in name:
            out[f"head.{name[len('lm_head.'):]}" if name.startswith("lm_head.") else name] = array
    return out


def decoder_config(model_cfg) -> dict[str, Any]:
    """A Hugging Face ModernBertDecoderConfig config.json for `config.model`: the encoder's keys, the decoder's type."""
    out = hf_config(model_cfg)
    # The decoder's config wants ints here (generation starts and stops on them): the tokenizer's [CLS] and [SEP]
    # replace these on write (bert_jax/hf/folder.py SPECIAL_ID_KEYS); without a tokenizer they stay the pad id.
    pad = out["pad_token_id"]
    out.update(model_type=DECODER_MODEL_TYPE, architectures=[DECODER_ARCHITECTURE], use_cache=True,
               bos_token_id=pad, eos_token_id=pad, cls_token_id=pad, sep_token_id=pad)
    return out


def hf_export(params: dict, model_cfg) -> HfExport:
    """The family hook: the HF state dict and config.json of our params, as the objective that trained them reads
    them: ModernBertForMaskedLM, or ModernBertDecoderForCausalLM for a causal one."""
    if is_causal(model_cfg):
        return HfExport(decoder_state(params_to_hf(params, model_cfg)), decoder_config(model_cfg))
    return HfExport(params_to_hf(params, model_cfg), hf_config(model_cfg))


def hf_import(state, hf_cfg: dict, model_cfg, fallback_params: dict) -> tuple[dict, ImportReport]:
    """The family hook: our params from an HF state dict, after checking its config fits `model_cfg`."""
    values = model_config_from_hf(hf_cfg)
    values.pop("objective", None)  # a decoder's weights continue in either objective: the run's config picks it
    # With num_layers <= n only layer 0 is global, whatever n: compare the layers, not n.
    every, layers = "global_attn_every_n_layers", values["num_layers"]
    if layer_types(layers, values[every]) == layer_types(layers, model_cfg.get(every, 3)):
        values[every] = model_cfg.get(every, 3)
    hf_bert.check_values_match(values, model_cfg, CONFIG_KEYS)
    return hf_to_params(state, model_cfg, fallback_params)


CONVERTER = HfConverter(model_type=MODEL_TYPE, also_reads=(DECODER_MODEL_TYPE,), to_hf=hf_export, from_hf=hf_import,
                        model_config=model_config_from_hf, vocab_tensors=VOCAB_TENSORS,
                        task_heads_missing=TASK_HEADS_MISSING)
