"""DistilBERT parameters <-> Hugging Face `DistilBertForMaskedLM` state dicts and config.json.

The encoder lives under `distilbert.` (embeddings without token types; layers named
q_lin/k_lin/v_lin/out_lin, sa_layer_norm, ffn.lin1/lin2, output_layer_norm); the head is
vocab_transform, vocab_layer_norm and vocab_projector (its weight tied to the word
embeddings). Pure functions on numpy arrays.
"""
from typing import Any

from bert_jax.hf.converter import HfClassifierHead, HfConverter
from bert_jax.hf import bert as hf_bert
from bert_jax.hf.exported import HfExport
from bert_jax.hf.bert import COPY, HEAD, HEADS_IN, HEADS_OUT, LINEAR, ImportReport, TensorSpec
from bert_jax.models.layers import ACTIVATIONS
from bert_jax.models.scan_layout import SCANNED

PREFIX = "distilbert"
HEAD_PREFIXES = ("vocab_transform.", "vocab_layer_norm.", "vocab_projector.")
TIED_ON_EXPORT = {"vocab_projector.weight": f"{PREFIX}.embeddings.word_embeddings.weight"}
IGNORED_ON_IMPORT = (f"{PREFIX}.embeddings.position_ids",)
# Tensors indexed by token id, by folder, for extend-vocab (checkpoint/vocab_rows.py): the word embeddings first.
VOCAB_TENSORS = {"": (f"{PREFIX}.embeddings.word_embeddings.weight", *TIED_ON_EXPORT, "vocab_projector.bias")}
# DistilBertForSequenceClassification's head: pre_classifier, ReLU, classifier (families.py).
CLASSIFIER_HEAD = HfClassifierHead(dense="pre_classifier", classifier="classifier", activation="relu")
# transformers hard-wires every DistilBERT LayerNorm's epsilon.
LAYER_NORM_EPS = 1e-12

# config.model key -> Hugging Face DistilBertConfig key; these must agree on import.
CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "dim",
    "num_layers": "n_layers",
    "num_heads": "n_heads",
    "intermediate_size": "hidden_dim",
    "max_position_embeddings": "max_position_embeddings",
    "hidden_act": "activation",
}


def tensor_specs(model_cfg) -> list[TensorSpec]:
    """Every tensor of a DistilBertForMaskedLM with `config.model`'s sizes, in Hugging Face order."""
    h, i_size, v = model_cfg.hidden_size, model_cfg.intermediate_size, model_cfg.vocab_size
    specs = []
    emb = "encoder/embeddings"
    hf_bert.add_tensor(specs, f"{PREFIX}.embeddings.word_embeddings.weight", f"{emb}/word/embedding", COPY, (v, h))
    hf_bert.add_tensor(specs, f"{PREFIX}.embeddings.position_embeddings.weight", f"{emb}/position/embedding", COPY,
                       (model_cfg.max_position_embeddings, h))
    hf_bert.add_norm(specs, f"{PREFIX}.embeddings.LayerNorm", f"{emb}/norm", h)
    for layer in range(model_cfg.num_layers):
        hf, ours = f"{PREFIX}.transformer.layer.{layer}", f"encoder/stack/{SCANNED}_{layer}"
        for hf_name, name in (("q_lin", "query"), ("k_lin", "key"), ("v_lin", "value")):
            hf_bert.add_dense(specs, f"{hf}.attention.{hf_name}", f"{ours}/attention/{name}", HEADS_IN, (h, h))
        hf_bert.add_dense(specs, f"{hf}.attention.out_lin", f"{ours}/attention/output", HEADS_OUT, (h, h))
        hf_bert.add_norm(specs, f"{hf}.sa_layer_norm", f"{ours}/attention_norm", h)
        hf_bert.add_dense(specs, f"{hf}.ffn.lin1", f"{ours}/intermediate", LINEAR, (i_size, h))
        hf_bert.add_dense(specs, f"{hf}.ffn.lin2", f"{ours}/mlp_output", LINEAR, (h, i_size))
        hf_bert.add_norm(specs, f"{hf}.output_layer_norm", f"{ours}/mlp_norm", h)
    hf_bert.add_dense(specs, "vocab_transform", "mlm_transform", LINEAR, (h, h), HEAD)
    hf_bert.add_norm(specs, "vocab_layer_norm", "mlm_norm", h, HEAD)
    hf_bert.add_tensor(specs, "vocab_projector.bias", "mlm_output_bias", COPY, (v,), HEAD)
    return specs


def params_to_hf(params: dict, model_cfg) -> dict:
    return hf_bert.specs_to_hf(params, tensor_specs(model_cfg), TIED_ON_EXPORT)


def hf_to_params(state, model_cfg, fallback_params: dict | None = None) -> tuple[dict, ImportReport]:
    """HF DistilBertForMaskedLM (or DistilBertModel: no `distilbert.` prefix, no head) state dict -> our params."""
    if not any(name.startswith(f"{PREFIX}.") for name in state):
        state = {name if name.startswith(HEAD_PREFIXES) else f"{PREFIX}.{name}": array
                 for name, array in state.items()}
    return hf_bert.specs_to_params(state, tensor_specs(model_cfg), set(TIED_ON_EXPORT) | set(IGNORED_ON_IMPORT),
                                   model_cfg, fallback_params)


def _check_layer_norm_eps(model_cfg) -> None:
    if abs(model_cfg.layer_norm_eps - LAYER_NORM_EPS) > 1e-18:
        raise ValueError(f"config.model.layer_norm_eps={model_cfg.layer_norm_eps}: transformers' DistilBERT "
                         f"hard-wires {LAYER_NORM_EPS}; set --config.model.layer_norm_eps={LAYER_NORM_EPS}")


def hf_config(model_cfg) -> dict[str, Any]:
    """A Hugging Face DistilBERT config.json for `config.model` (learned positions, tied decoder)."""
    _check_layer_norm_eps(model_cfg)
    out = {hf: model_cfg[ours] for ours, hf in CONFIG_KEYS.items()}
    out.update(
        model_type="distilbert", architectures=["DistilBertForMaskedLM"],
        dropout=float(model_cfg.dropout_rate), attention_dropout=float(model_cfg.attention_dropout_rate),
        initializer_range=float(model_cfg.initializer_range), sinusoidal_pos_embds=False,
        pad_token_id=int(model_cfg.get("pad_token_id", 0)), tie_word_embeddings=True, torch_dtype="float32",
    )
    return out


def model_config_from_hf(hf_cfg: dict) -> dict[str, Any]:
    """config.model values read from a Hugging Face DistilBERT config.json."""
    values = hf_bert.read_config_values(
        hf_cfg, model_type="distilbert", family="distilbert", keys=CONFIG_KEYS, defaults={"hidden_act": "gelu"},
        implemented={"sinusoidal_pos_embds": (False,), "activation": ("gelu", *sorted(set(ACTIVATIONS) - {"gelu"}))},
    )
    return {**values, "layer_norm_eps": LAYER_NORM_EPS}


def hf_export(params: dict, model_cfg) -> HfExport:
    """The family hook: the HF state dict and config.json of our params."""
    return HfExport(params_to_hf(params, model_cfg), hf_config(model_cfg))


def hf_import(state, hf_cfg: dict, model_cfg, fallback_params: dict) -> tuple[dict, ImportReport]:
    """The family hook: our params from an HF state dict, after checking its config fits `model_cfg`."""
    hf_bert.check_values_match(model_config_from_hf(hf_cfg), model_cfg,
                               {**CONFIG_KEYS, "layer_norm_eps": "(hard-wired LayerNorm epsilon)"})
    return hf_to_params(state, model_cfg, fallback_params)


CONVERTER = HfConverter(model_type="distilbert", to_hf=hf_export, from_hf=hf_import,
                        model_config=model_config_from_hf, vocab_tensors=VOCAB_TENSORS,
                        classifier_head=CLASSIFIER_HEAD)
