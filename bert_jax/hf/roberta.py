"""RoBERTa parameters <-> Hugging Face `RobertaForMaskedLM` state dicts and config.json.

The encoder's tensors are BERT's under `roberta.`; the head is `lm_head` (dense,
layer_norm, bias, decoder tied to the word embeddings). Pure functions on numpy arrays.
"""
from typing import Any

from bert_jax.hf.converter import HfConverter
from bert_jax.hf import bert as hf_bert
from bert_jax.hf.exported import HfExport
from bert_jax.hf.bert import COPY, HEAD, LINEAR, ImportReport, TensorSpec

PREFIX = "roberta"
TIED_ON_EXPORT = {
    "lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight",
    "lm_head.decoder.bias": "lm_head.bias",
}
IGNORED_ON_IMPORT = ("roberta.embeddings.position_ids", "roberta.embeddings.token_type_ids")
# Tensors indexed by token id, by folder, for extend-vocab (checkpoint/vocab_rows.py): the word embeddings first.
VOCAB_TENSORS = {"": (f"{PREFIX}.embeddings.word_embeddings.weight", *TIED_ON_EXPORT, "lm_head.bias")}

CONFIG_KEYS = {**hf_bert.CONFIG_KEYS, "pad_token_id": "pad_token_id"}


def tensor_specs(model_cfg) -> list[TensorSpec]:
    """Every tensor of a RobertaForMaskedLM with `config.model`'s sizes."""
    h = model_cfg.hidden_size
    specs = hf_bert.encoder_specs(model_cfg, PREFIX)
    hf_bert.add_dense(specs, "lm_head.dense", "mlm_transform", LINEAR, (h, h), HEAD)
    hf_bert.add_norm(specs, "lm_head.layer_norm", "mlm_norm", h, HEAD)
    hf_bert.add_tensor(specs, "lm_head.bias", "mlm_output_bias", COPY, (model_cfg.vocab_size,), HEAD)
    return specs


def params_to_hf(params: dict, model_cfg):
    return hf_bert.specs_to_hf(params, tensor_specs(model_cfg), TIED_ON_EXPORT)


def hf_to_params(state, model_cfg, fallback_params: dict | None = None) -> tuple[dict, ImportReport]:
    """HF RobertaForMaskedLM (or RobertaModel: no `roberta.` prefix, no head) state dict -> our params."""
    if not any(name.startswith(f"{PREFIX}.") for name in state):
        state = {name if name.startswith("lm_head.") else f"{PREFIX}.{name}": array for name, array in state.items()}
    return hf_bert.specs_to_params(state, tensor_specs(model_cfg), set(TIED_ON_EXPORT) | set(IGNORED_ON_IMPORT),
                                   model_cfg, fallback_params)


def hf_config(model_cfg) -> dict[str, Any]:
    """A Hugging Face RoBERTa config.json for `config.model` (exact GELU, absolute positions offset by the pad id)."""
    # Byte-level BPE's specials: <s>=0 <pad>=1 </s>=2 (bert_jax.commands.tokenizer); a folder written with another
    # vocabulary gets that vocabulary's ids (bert_jax/hf/folder.py's with_tokenizer_ids).
    return hf_bert.config_json(model_cfg, CONFIG_KEYS, model_type="roberta", architectures=["RobertaForMaskedLM"],
                               hidden_act="gelu", bos_token_id=0, eos_token_id=2)


def model_config_from_hf(hf_cfg: dict) -> dict[str, Any]:
    """config.model values read from a Hugging Face RoBERTa config.json."""
    return hf_bert.read_config_values(
        hf_cfg, model_type="roberta", family="roberta", keys=CONFIG_KEYS,
        defaults={"layer_norm_eps": 1e-5, "pad_token_id": 1},
        implemented={"hidden_act": ("gelu",), "position_embedding_type": ("absolute",)},
    )


def hf_export(params: dict, model_cfg) -> HfExport:
    """The family hook: the HF state dict and config.json of our params."""
    return HfExport(params_to_hf(params, model_cfg), hf_config(model_cfg))


def hf_import(state, hf_cfg: dict, model_cfg, fallback_params: dict) -> tuple[dict, ImportReport]:
    """The family hook: our params from an HF state dict, after checking its config fits `model_cfg`."""
    hf_bert.check_values_match(model_config_from_hf(hf_cfg), model_cfg, CONFIG_KEYS)
    return hf_to_params(state, model_cfg, fallback_params)


CONVERTER = HfConverter(model_type="roberta", to_hf=hf_export, from_hf=hf_import, model_config=model_config_from_hf,
                        vocab_tensors=VOCAB_TENSORS)
