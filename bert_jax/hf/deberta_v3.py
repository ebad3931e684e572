"""DeBERTa-v3 parameters <-> Hugging Face `DebertaV2ForMaskedLM` / `DebertaV2Model` state dicts and config.json.

The encoder lives under `deberta.` (no prefix in DebertaV2Model folders); the legacy MLM
head is `cls.predictions` (transform.dense, transform.LayerNorm, bias; the decoder is tied
to the word embeddings). Pure functions on numpy arrays.

The family hooks move the pre-training model (models/deberta_v3.DebertaV3) as a released
DeBERTa-v3 checkpoint holds it: the discriminator's encoder under `deberta.`, with the merged
word table (the generator's + the GDES delta), and its replaced-token head as
`mask_predictions.*` (which transformers ignores). The generator goes beside it, in
`generator/`, as a DebertaV2ForMaskedLM with the shared table. An import with a generator
folder takes its table as the shared one and the difference to the merged table as the delta
(equal to the exported delta up to float32 rounding of one subtraction); without one (a released
checkpoint) the generator starts afresh from the fallback, the imported table is shared and the
delta zero, so the discriminator reads exactly the imported table.
"""
from typing import Any

import flax.linen as nn
import ml_collections
import numpy as np

from bert_jax.hf.converter import HfClassifierHead, HfConverter
from bert_jax.hf import bert as hf_bert
from bert_jax.hf.exported import HfExport
from bert_jax.hf.bert import COPY, HEAD, HEADS_IN, HEADS_OUT, LINEAR, ImportReport, TensorSpec
from bert_jax.models.deberta_v3 import DebertaV3Config
from bert_jax.models.scan_layout import SCANNED

PREFIX = "deberta"
GENERATOR_FOLDER = "generator"
TIED_ON_EXPORT = {
    "cls.predictions.decoder.weight": f"{PREFIX}.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
IGNORED_ON_IMPORT = (f"{PREFIX}.embeddings.position_ids",)
# Tensors indexed by token id, by folder, for extend-vocab (checkpoint/vocab_rows.py): the merged GDES table in the
# main folder, the generator's shared table with its tied decoder and MLM bias in `generator/`.
VOCAB_TENSORS = {"": (f"{PREFIX}.embeddings.word_embeddings.weight",),
                 GENERATOR_FOLDER: (f"{PREFIX}.embeddings.word_embeddings.weight", *TIED_ON_EXPORT,
                                    "cls.predictions.bias")}

# DebertaV2ForSequenceClassification's head: ContextPooler (dense, pooler_hidden_act) then classifier (families.py).
CLASSIFIER_HEAD = HfClassifierHead(dense="pooler.dense", classifier="classifier", activation="gelu",
                                   config=(("pooler_hidden_act", "gelu"),))
CONFIG_KEYS = {
    **{k: v for k, v in hf_bert.CONFIG_KEYS.items() if k != "max_position_embeddings"},
    "position_buckets": "position_buckets",
    "max_relative_positions": "max_relative_positions",
    "pad_token_id": "pad_token_id",
}
# What DeBERTa-v3 is, in DebertaV2Config's words: the values this family implements (the first is written).
V3_ARCHITECTURE = {
    "relative_attention": (True,),
    "position_biased_input": (False,),
    "share_att_key": (True,),
    "pos_att_type": (["p2c", "c2p"], ["c2p", "p2c"], "p2c|c2p", "c2p|p2c"),
    "norm_rel_ebd": ("layer_norm",),
    "conv_kernel_size": (0,),
    "hidden_act": ("gelu",),
    "legacy": (True,),
}
STATED = ("relative_attention", "position_biased_input", "share_att_key", "pos_att_type", "norm_rel_ebd")


def encoder_specs(model_cfg, prefix: str = PREFIX) -> list[TensorSpec]:
    """Embeddings, relative table and layers of a DebertaEncoder (`encoder/...`) under HF's `{prefix}.`."""
    h, i_size = model_cfg.hidden_size, model_cfg.intermediate_size
    specs = []
    hf_bert.add_tensor(specs, f"{prefix}.embeddings.word_embeddings.weight", "encoder/word/embedding", COPY,
                       (model_cfg.vocab_size, h))
    if model_cfg.get("type_vocab_size", 0) > 0:
        hf_bert.add_tensor(specs, f"{prefix}.embeddings.token_type_embeddings.weight",
                           "encoder/token_type/embedding", COPY, (model_cfg.type_vocab_size, h))
    hf_bert.add_norm(specs, f"{prefix}.embeddings.LayerNorm", "encoder/embedding_norm", h)
    for layer in range(model_cfg.num_layers):
        hf, ours = f"{prefix}.encoder.layer.{layer}", f"encoder/stack/{SCANNED}_{layer}"
        for name in ("query", "key", "value"):
            hf_bert.add_dense(specs, f"{hf}.attention.self.{name}_proj", f"{ours}/attention/{name}", HEADS_IN, (h, h))
        hf_bert.add_dense(specs, f"{hf}.attention.output.dense", f"{ours}/attention/output", HEADS_OUT, (h, h))
        hf_bert.add_norm(specs, f"{hf}.attention.output.LayerNorm", f"{ours}/attention_norm", h)
        hf_bert.add_dense(specs, f"{hf}.intermediate.dense", f"{ours}/intermediate", LINEAR, (i_size, h))
        hf_bert.add_dense(specs, f"{hf}.output.dense", f"{ours}/mlp_output", LINEAR, (h, i_size))
        hf_bert.add_norm(specs, f"{hf}.output.LayerNorm", f"{ours}/mlp_norm", h)
    hf_bert.add_tensor(specs, f"{prefix}.encoder.rel_embeddings.weight", "encoder/rel_embeddings/embedding", COPY,
                       (2 * model_cfg.position_buckets, h))
    hf_bert.add_norm(specs, f"{prefix}.encoder.LayerNorm", "encoder/rel_norm", h)
    return specs


def tensor_specs(model_cfg) -> list[TensorSpec]:
    """Every tensor of a DebertaV2ForMaskedLM (legacy head) with `config.model`'s sizes."""
    h = model_cfg.hidden_size
    specs = encoder_specs(model_cfg)
    hf_bert.add_dense(specs, "cls.predictions.transform.dense", "mlm_transform", LINEAR, (h, h), HEAD)
    hf_bert.add_norm(specs, "cls.predictions.transform.LayerNorm", "mlm_norm", h, HEAD)
    hf_bert.add_tensor(specs, "cls.predictions.bias", "mlm_output_bias", COPY, (model_cfg.vocab_size,), HEAD)
    return specs


def discriminator_specs(model_cfg) -> list[TensorSpec]:
    """The discriminator (DebertaV3Discriminator's tree) in a released DeBERTa-v3 checkpoint's names."""
    h = model_cfg.hidden_size
    specs = encoder_specs(model_cfg)
    hf_bert.add_norm(specs, "mask_predictions.LayerNorm", "rtd_norm", h, HEAD)
    hf_bert.add_dense(specs, "mask_predictions.dense", "rtd_transform", LINEAR, (h, h), HEAD)
    hf_bert.add_dense(specs, "mask_predictions.classifier", "rtd_output", LINEAR, (1, h), HEAD)
    return specs


def params_to_hf(params: dict, model_cfg) -> dict:
    """Our DebertaV3ForMaskedLM params (scanned or unrolled) -> DebertaV2ForMaskedLM state dict."""
    return hf_bert.specs_to_hf(params, tensor_specs(model_cfg), TIED_ON_EXPORT)


def with_model_prefix(state: dict) -> dict:
    """DebertaV2Model folders name the encoder's tensors without `deberta.`; ForMaskedLM ones with it."""
    if any(name.startswith(f"{PREFIX}.") for name in state):
        return state
    return {name if name.startswith("cls.") else f"{PREFIX}.{name}": array for name, array in state.items()}


def hf_to_params(state, model_cfg, fallback_params: dict | None = None) -> tuple[dict, ImportReport]:
    """HF DebertaV2ForMaskedLM (or DebertaV2Model: head from `fallback_params`) state dict -> our params."""
    return hf_bert.specs_to_params(with_model_prefix(state), tensor_specs(model_cfg),
                                   set(TIED_ON_EXPORT) | set(IGNORED_ON_IMPORT), model_cfg, fallback_params)


def hf_config(model_cfg, architecture: str = "DebertaV2ForMaskedLM") -> dict[str, Any]:
    """A Hugging Face DebertaV2Config (DeBERTa-v3's architecture) for `config.model`."""
    hf_cfg = hf_bert.config_json(
        model_cfg, CONFIG_KEYS, model_type="deberta-v2", architectures=[architecture],
        # No absolute positions are read; this only bounds inputs (transformers' default).
        max_position_embeddings=int(model_cfg.get("max_position_embeddings", 512)),
        # Read by bert_jax.hf.folder when the run's tokenizer is SentencePiece (the unigram kind).
        tokenizer_class="DebertaV2Tokenizer",
        **{key: values[0] for key, values in V3_ARCHITECTURE.items()},
    )
    hf_cfg.pop("position_embedding_type")
    return hf_cfg


def model_config_from_hf(hf_cfg: dict) -> dict[str, Any]:
    """config.model values read from a Hugging Face DeBERTa-v3 config.json."""
    # transformers' defaults for these are DeBERTa-v1's (no relative attention, absolute positions):
    # a v3 config.json states them, so they are checked as stated, never defaulted.
    for key in STATED:
        if hf_cfg.get(key) not in V3_ARCHITECTURE[key]:
            raise ValueError(f"config.json {key}={hf_cfg.get(key)!r}: the deberta_v3 family implements only "
                             f"{key}={V3_ARCHITECTURE[key][0]!r} (DeBERTa-v3)")
    values = hf_bert.read_config_values(
        hf_cfg, model_type="deberta-v2", family="deberta_v3", keys=CONFIG_KEYS,
        defaults={"layer_norm_eps": 1e-7, "pad_token_id": 0, "type_vocab_size": 0, "max_relative_positions": -1},
        implemented={key: values for key, values in V3_ARCHITECTURE.items() if key not in STATED},
    )
    if values["max_relative_positions"] < 1:  # transformers: -1 means max_position_embeddings
        values["max_relative_positions"] = hf_cfg.get("max_position_embeddings", 512)
    return values


def discriminator_to_hf(params: dict, model_cfg) -> dict:
    """DebertaV3 params (generator, discriminator, shared `word`, GDES delta) -> the discriminator's
    state dict, with the merged table a DeBERTa-v3 checkpoint holds."""
    params = nn.meta.unbox(params)
    merged = np.asarray(params["word"]["embedding"], np.float32) + np.asarray(
        params["discriminator_word"]["delta"], np.float32)
    discriminator = params["discriminator"]
    tree = {**discriminator, "encoder": {**discriminator["encoder"], "word": {"embedding": merged}}}
    return hf_bert.specs_to_hf(tree, discriminator_specs(model_cfg), {})


def generator_config(model_cfg) -> ml_collections.ConfigDict:
    """config.model of the generator alone: the discriminator's, generator_num_layers deep."""
    gen_cfg = ml_collections.ConfigDict(model_cfg.to_dict())
    gen_cfg.num_layers = DebertaV3Config.from_config(model_cfg).generator_num_layers
    return gen_cfg


def generator_to_hf(params: dict, model_cfg) -> dict:
    """DebertaV3 params -> the generator's DebertaV2ForMaskedLM state dict, with the shared table."""
    params = nn.meta.unbox(params)
    generator = params["generator"]
    tree = {**generator, "encoder": {**generator["encoder"], "word": params["word"]}}
    return hf_bert.specs_to_hf(tree, tensor_specs(generator_config(model_cfg)), TIED_ON_EXPORT)


def hf_to_discriminator(state, model_cfg, fallback_params: dict, generator=None) -> tuple[dict, ImportReport]:
    """A DeBERTa-v3 checkpoint (DebertaV2Model or ForMaskedLM names) -> DebertaV3 params, the discriminator's
    head from the fallback if absent; see the module docstring for the table, the delta and the generator.
    generator: the generator folder's (state dict, config.json), or None. An MLM head in the main folder
    (`cls.*`, `lm_predictions.*`) is reported unused."""
    fallback = nn.meta.unbox(fallback_params)
    discriminator_fallback = {**fallback["discriminator"],
                              "encoder": {**fallback["discriminator"]["encoder"], "word": fallback["word"]}}
    imported, report = hf_bert.specs_to_params(with_model_prefix(state), discriminator_specs(model_cfg),
                                               set(IGNORED_ON_IMPORT), model_cfg, discriminator_fallback)
    merged = imported["encoder"].pop("word")["embedding"]
    if generator is None:
        report.kept_from_fallback.append(
            f"{GENERATOR_FOLDER}/ (no {GENERATOR_FOLDER} folder, as in a released DeBERTa-v3: the whole generator)")
        return {"word": {"embedding": merged}, "discriminator_word": {"delta": np.zeros_like(merged)},
                "discriminator": imported, "generator": fallback["generator"]}, report
    gen_state, gen_hf_cfg = generator
    gen_cfg = generator_config(model_cfg)
    if gen_hf_cfg.get("num_hidden_layers") != gen_cfg.num_layers:
        raise ValueError(f"config.model.generator_num_layers gives the generator {gen_cfg.num_layers} layers but "
                         f"{GENERATOR_FOLDER}/config.json says num_hidden_layers={gen_hf_cfg.get('num_hidden_layers')}")
    hf_bert.check_values_match(model_config_from_hf(gen_hf_cfg), gen_cfg, CONFIG_KEYS)
    gen_fallback = {**fallback["generator"], "encoder": {**fallback["generator"]["encoder"], "word": fallback["word"]}}
    gen_params, gen_report = hf_to_params(gen_state, gen_cfg, gen_fallback)
    word = gen_params["encoder"].pop("word")["embedding"]
    report.kept_from_fallback.extend(f"{GENERATOR_FOLDER}/{name}" for name in gen_report.kept_from_fallback)
    report.unused.extend(f"{GENERATOR_FOLDER}/{name}" for name in gen_report.unused)
    return {"word": {"embedding": word}, "discriminator_word": {"delta": merged - word},
            "discriminator": imported, "generator": gen_params}, report


def hf_export(params: dict, model_cfg) -> HfExport:
    """The family hook: the discriminator as a DebertaV2Model folder, the generator as `generator/`."""
    generator = (generator_to_hf(params, model_cfg), hf_config(generator_config(model_cfg)))
    return HfExport(discriminator_to_hf(params, model_cfg), hf_config(model_cfg, architecture="DebertaV2Model"),
                    {GENERATOR_FOLDER: generator})


def hf_import(state, hf_cfg: dict, model_cfg, fallback_params: dict, extras: dict | None = None
              ) -> tuple[dict, ImportReport]:
    """The family hook: DebertaV3 params from a DeBERTa-v3 folder (and its `generator/`, when in `extras`),
    after checking its config fits."""
    hf_bert.check_values_match(model_config_from_hf(hf_cfg), model_cfg, CONFIG_KEYS)
    return hf_to_discriminator(state, model_cfg, fallback_params, (extras or {}).get(GENERATOR_FOLDER))


CONVERTER = HfConverter(model_type="deberta-v2", to_hf=hf_export, from_hf=hf_import,
                        model_config=model_config_from_hf, subfolders=(GENERATOR_FOLDER,),
                        vocab_tensors=VOCAB_TENSORS, classifier_head=CLASSIFIER_HEAD)
