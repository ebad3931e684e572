"""ALBERT parameters <-> Hugging Face `AlbertForPreTraining` state dicts and config.json.

Hugging Face keeps one layer per group (`albert.encoder.albert_layer_groups.{g}.albert_layers.0`,
inner_group_num = 1), as we do (`encoder/stack/group_{g}`); shared parameters have no layer
axis in either, so scanned and unrolled runs convert alike. Pure functions on numpy arrays.
"""
from typing import Any

from bert_jax.hf.converter import HfConverter
from bert_jax.hf import bert as hf_bert
from bert_jax.hf.exported import HfExport
from bert_jax.hf.bert import COPY, HEAD, HEADS_IN, HEADS_OUT, LINEAR, ImportReport, TensorSpec
from bert_jax.models.layers import ACTIVATIONS

TIED_ON_EXPORT = {
    "predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
    "predictions.decoder.bias": "predictions.bias",
}
IGNORED_ON_IMPORT = ("albert.embeddings.position_ids", "albert.embeddings.token_type_ids")
# Tensors indexed by token id, by folder, for extend-vocab (checkpoint/vocab_rows.py): the factorised word table
# [vocab, embedding_size] first.
VOCAB_TENSORS = {"": ("albert.embeddings.word_embeddings.weight", *TIED_ON_EXPORT, "predictions.bias")}

CONFIG_KEYS = {
    **hf_bert.CONFIG_KEYS,
    "embedding_size": "embedding_size",
    "num_hidden_groups": "num_hidden_groups",
    "hidden_act": "hidden_act",
}


def tensor_specs(model_cfg) -> list[TensorSpec]:
    """Every tensor of an AlbertForPreTraining with `config.model`'s sizes, in Hugging Face order."""
    h, e, v, i_size = model_cfg.hidden_size, model_cfg.embedding_size, model_cfg.vocab_size, model_cfg.intermediate_size
    specs = []
    add, norm, dense = hf_bert.add_tensor, hf_bert.add_norm, hf_bert.add_dense
    emb = "encoder/embeddings"
    add(specs, "albert.embeddings.word_embeddings.weight", f"{emb}/word/embedding", COPY, (v, e))
    add(specs, "albert.embeddings.position_embeddings.weight", f"{emb}/position/embedding", COPY,
        (model_cfg.max_position_embeddings, e))
    add(specs, "albert.embeddings.token_type_embeddings.weight", f"{emb}/token_type/embedding", COPY,
        (model_cfg.type_vocab_size, e))
    norm(specs, "albert.embeddings.LayerNorm", f"{emb}/norm", e)
    dense(specs, "albert.encoder.embedding_hidden_mapping_in", "encoder/embedding_hidden_mapping_in", LINEAR, (h, e))
    for group in range(model_cfg.num_hidden_groups):
        hf, ours = f"albert.encoder.albert_layer_groups.{group}.albert_layers.0", f"encoder/stack/group_{group}"
        for name in ("query", "key", "value"):
            dense(specs, f"{hf}.attention.{name}", f"{ours}/attention/{name}", HEADS_IN, (h, h))
        dense(specs, f"{hf}.attention.dense", f"{ours}/attention/output", HEADS_OUT, (h, h))
        norm(specs, f"{hf}.attention.LayerNorm", f"{ours}/attention_norm", h)
        dense(specs, f"{hf}.ffn", f"{ours}/intermediate", LINEAR, (i_size, h))
        dense(specs, f"{hf}.ffn_output", f"{ours}/mlp_output", LINEAR, (h, i_size))
        norm(specs, f"{hf}.full_layer_layer_norm", f"{ours}/mlp_norm", h)
    dense(specs, "albert.pooler", "pooler", LINEAR, (h, h), HEAD)
    dense(specs, "predictions.dense", "mlm_transform", LINEAR, (e, h), HEAD)
    norm(specs, "predictions.LayerNorm", "mlm_norm", e, HEAD)
    add(specs, "predictions.bias", "mlm_output_bias", COPY, (v,), HEAD)
    dense(specs, "sop_classifier.classifier", "sop", LINEAR, (2, h), HEAD)
    return specs


def params_to_hf(params: dict, model_cfg):
    return hf_bert.specs_to_hf(params, tensor_specs(model_cfg), TIED_ON_EXPORT)


def hf_to_params(state, model_cfg, fallback_params: dict | None = None) -> tuple[dict, ImportReport]:
    """HF AlbertForPreTraining / AlbertForMaskedLM / AlbertModel (no `albert.` prefix) state dict -> our params."""
    if not any(name.startswith("albert.") for name in state):
        state = {name if name.startswith(("predictions.", "sop_classifier.")) else f"albert.{name}": array
                 for name, array in state.items()}
    return hf_bert.specs_to_params(state, tensor_specs(model_cfg), set(TIED_ON_EXPORT) | set(IGNORED_ON_IMPORT),
                                   model_cfg, fallback_params)


def hf_config(model_cfg) -> dict[str, Any]:
    """A Hugging Face ALBERT config.json for `config.model`."""
    # SentencePiece specials as ALBERT orders them: <pad>=0 <unk>=1 [CLS]=2 [SEP]=3.
    return hf_bert.config_json(
        model_cfg, CONFIG_KEYS, model_type="albert", architectures=["AlbertForPreTraining"], inner_group_num=1,
        classifier_dropout_prob=float(model_cfg.dropout_rate), pad_token_id=int(model_cfg.get("pad_token_id", 0)),
        bos_token_id=2, eos_token_id=3,
    )


def model_config_from_hf(hf_cfg: dict) -> dict[str, Any]:
    """config.model values read from a Hugging Face ALBERT config.json."""
    return hf_bert.read_config_values(
        hf_cfg, model_type="albert", family="albert", keys=CONFIG_KEYS,
        defaults={"layer_norm_eps": 1e-12, "embedding_size": 128, "num_hidden_groups": 1, "hidden_act": "gelu_new",
                  "type_vocab_size": 2, "max_position_embeddings": 512},
        # One layer per group: inner_group_num > 1 would need a second level of sharing.
        implemented={"inner_group_num": (1,), "position_embedding_type": ("absolute",),
                     "hidden_act": ("gelu_new", *sorted(set(ACTIVATIONS) - {"gelu_new"}))},
    )


def hf_export(params: dict, model_cfg) -> HfExport:
    """The family hook: the HF state dict and config.json of our params."""
    return HfExport(params_to_hf(params, model_cfg), hf_config(model_cfg))


def hf_import(state, hf_cfg: dict, model_cfg, fallback_params: dict) -> tuple[dict, ImportReport]:
    """The family hook: our params from an HF state dict, after checking its config fits `model_cfg`."""
    hf_bert.check_values_match(model_config_from_hf(hf_cfg), model_cfg, CONFIG_KEYS)
    return hf_to_params(state, model_cfg, fallback_params)


CONVERTER = HfConverter(model_type="albert", to_hf=hf_export, from_hf=hf_import, model_config=model_config_from_hf,
                        vocab_tensors=VOCAB_TENSORS)
