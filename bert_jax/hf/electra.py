"""ELECTRA parameters <-> Hugging Face `ElectraForPreTraining` (discriminator) and `ElectraForMaskedLM` (generator).

One of our ELECTRA modules is two Hugging Face models: export writes the discriminator as the
main folder (what fine-tuning starts from) and the generator as `generator/` inside it; both
carry the shared embeddings, as Google's released pairs do. Import reads the discriminator
folder and, when present, its `generator/`; without one the generator stays as initialised
(reported). The shared embeddings come from the discriminator. Pure functions on numpy arrays.
"""
import math
import types
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from bert_jax.hf.converter import HfClassifierHead, HfConverter
from bert_jax.hf import bert as hf_bert
from bert_jax.hf.exported import HfExport
from bert_jax.hf.bert import COPY, HEAD, LINEAR, ImportReport, TensorSpec
from bert_jax.models.electra import ElectraConfig
from bert_jax.models.layers import ACTIVATIONS

GENERATOR_FOLDER = "generator"
TIED_ON_EXPORT = {"generator_lm_head.weight": "electra.embeddings.word_embeddings.weight"}
IGNORED_ON_IMPORT = ("electra.embeddings.position_ids", "electra.embeddings.token_type_ids")
# Tensors indexed by token id, by folder, for extend-vocab (checkpoint/vocab_rows.py): the shared word table in
# both, and the generator's tied decoder and MLM bias.
VOCAB_TENSORS = {"": ("electra.embeddings.word_embeddings.weight",),
                 GENERATOR_FOLDER: ("electra.embeddings.word_embeddings.weight", *TIED_ON_EXPORT,
                                    "generator_lm_head.bias")}

# ElectraForSequenceClassification's head (ElectraClassificationHead): dense, exact GELU, out_proj (families.py).
CLASSIFIER_HEAD = HfClassifierHead(dense="classifier.dense", classifier="classifier.out_proj", activation="gelu")
CONFIG_KEYS = {**hf_bert.CONFIG_KEYS, "embedding_size": "embedding_size", "hidden_act": "hidden_act"}


def _sizes(model_cfg, generator: bool) -> types.SimpleNamespace:
    """The network's sizes (the generator's scaled by generator_size_ratio), for specs and head reshapes."""
    cfg = ElectraConfig(**{k: model_cfg[k] for k in ("hidden_size", "num_heads", "intermediate_size",
                                                     "generator_size_ratio") if k in model_cfg})
    if generator:
        cfg = cfg.generator_config()
    return types.SimpleNamespace(hidden_size=cfg.hidden_size, num_heads=cfg.num_heads,
                                 intermediate_size=cfg.intermediate_size, scan_layers=model_cfg.scan_layers)


def _network_specs(model_cfg, network: str) -> list[TensorSpec]:
    """The embeddings (shared, `embeddings/`), the projection and the stack of `network` under HF's `electra.`."""
    sizes = _sizes(model_cfg, network == "generator")
    h, e = sizes.hidden_size, model_cfg.embedding_size
    specs = []
    add = hf_bert.add_tensor
    add(specs, "electra.embeddings.word_embeddings.weight", "embeddings/word/embedding", COPY,
        (model_cfg.vocab_size, e))
    add(specs, "electra.embeddings.position_embeddings.weight", "embeddings/position/embedding", COPY,
        (model_cfg.max_position_embeddings, e))
    add(specs, "electra.embeddings.token_type_embeddings.weight", "embeddings/token_type/embedding", COPY,
        (model_cfg.type_vocab_size, e))
    hf_bert.add_norm(specs, "electra.embeddings.LayerNorm", "embeddings/norm", e)
    if e != h:
        hf_bert.add_dense(specs, "electra.embeddings_project", f"{network}/encoder/embeddings_project", LINEAR, (h, e))
    hf_bert.add_layer_stack(specs, "electra.encoder.layer", f"{network}/encoder/stack", model_cfg.num_layers, h,
                            sizes.intermediate_size)
    return specs


def discriminator_specs(model_cfg) -> list[TensorSpec]:
    """Every tensor of an ElectraForPreTraining with `config.model`'s sizes, in Hugging Face order."""
    h = model_cfg.hidden_size
    specs = _network_specs(model_cfg, "discriminator")
    hf_bert.add_dense(specs, "discriminator_predictions.dense", "discriminator/rtd_transform", LINEAR, (h, h), HEAD)
    hf_bert.add_dense(specs, "discriminator_predictions.dense_prediction", "discriminator/rtd_output", LINEAR,
                      (1, h), HEAD)
    return specs


def generator_specs(model_cfg) -> list[TensorSpec]:
    """Every tensor of the ElectraForMaskedLM our generator is, in Hugging Face order."""
    h, e = _sizes(model_cfg, generator=True).hidden_size, model_cfg.embedding_size
    specs = _network_specs(model_cfg, "generator")
    hf_bert.add_norm(specs, "generator_predictions.LayerNorm", "generator/mlm_norm", e, HEAD)
    hf_bert.add_dense(specs, "generator_predictions.dense", "generator/mlm_transform", LINEAR, (e, h), HEAD)
    hf_bert.add_tensor(specs, "generator_lm_head.bias", "generator/mlm_output_bias", COPY, (model_cfg.vocab_size,),
                       HEAD)
    return specs


def hf_config(model_cfg, generator: bool = False) -> dict[str, Any]:
    """The Hugging Face config.json of the discriminator (ElectraForPreTraining) or of the generator."""
    sizes = _sizes(model_cfg, generator)
    values = {**dict(model_cfg.items()), "hidden_size": sizes.hidden_size, "num_heads": sizes.num_heads,
              "intermediate_size": sizes.intermediate_size}
    return hf_bert.config_json(
        ml_collections.ConfigDict(values), CONFIG_KEYS, model_type="electra",
        architectures=["ElectraForMaskedLM" if generator else "ElectraForPreTraining"],
        pad_token_id=int(model_cfg.get("pad_token_id", 0)), summary_type="first", summary_use_proj=True,
        summary_activation="gelu", summary_last_dropout=float(model_cfg.dropout_rate),
    )


def hf_export(params: dict, model_cfg) -> HfExport:
    """The family hook: the discriminator's state dict and config.json, and the generator's as folder `generator`."""
    discriminator = hf_bert.specs_to_hf(params, discriminator_specs(model_cfg), {})
    generator = hf_bert.specs_to_hf(params, generator_specs(model_cfg), TIED_ON_EXPORT)
    return HfExport(discriminator, hf_config(model_cfg), {GENERATOR_FOLDER: (generator, hf_config(model_cfg, True))})


def model_config_from_hf(hf_cfg: dict) -> dict[str, Any]:
    """config.model values read from a Hugging Face ELECTRA config.json."""
    return hf_bert.read_config_values(
        hf_cfg, model_type="electra", family="electra", keys=CONFIG_KEYS,
        defaults={"layer_norm_eps": 1e-12, "embedding_size": 128, "hidden_act": "gelu", "type_vocab_size": 2,
                  "max_position_embeddings": 512},
        implemented={"position_embedding_type": ("absolute",),
                     "hidden_act": ("gelu", *sorted(set(ACTIVATIONS) - {"gelu"}))},
    )


def discriminator_config_from_hf(hf_cfg: dict) -> dict[str, Any]:
    """config.model values for an ELECTRA discriminator folder read without a config of ours (fine-tuning).

    The folder says nothing of a generator, which fine-tuning never runs; the ratio is the smallest
    1/k that divides heads, hidden and FFN sizes evenly, so the unused generator is as small as can be.
    """
    values = model_config_from_hf(hf_cfg)
    divisor = math.gcd(values["num_heads"], values["hidden_size"], values["intermediate_size"])
    return dict(values, generator_size_ratio=1 / divisor)


def _check_generator_config(hf_cfg: dict, model_cfg) -> None:
    values = model_config_from_hf(hf_cfg)
    sizes = vars(_sizes(model_cfg, generator=True))
    for key in ("hidden_size", "num_heads", "intermediate_size"):
        if values[key] != sizes[key]:
            raise ValueError(
                f"the generator folder's config.json has {CONFIG_KEYS[key]}={values[key]}, but "
                f"config.model.generator_size_ratio={model_cfg.generator_size_ratio} gives the generator "
                f"{key}={sizes[key]}; set --config.model.generator_size_ratio to match")
    shared = {k: v for k, v in values.items() if k not in sizes}
    hf_bert.check_values_match(shared, model_cfg, CONFIG_KEYS)


def _strip_head_prefix(state: dict) -> dict:
    """An ElectraModel folder (no `electra.` prefix): the encoder alone."""
    if any(name.startswith("electra.") for name in state):
        return state
    return {f"electra.{name}": array for name, array in state.items()}


def hf_import(state, hf_cfg: dict, model_cfg, fallback_params: dict, extras: dict | None = None
              ) -> tuple[dict, ImportReport]:
    """The family hook: our params from the discriminator's HF state dict and, if `extras` holds it, the
    generator folder's (state dict, config.json); without one the generator keeps `fallback_params`."""
    hf_bert.check_values_match(model_config_from_hf(hf_cfg), model_cfg, CONFIG_KEYS)
    known = set(IGNORED_ON_IMPORT)
    params, report = hf_bert.specs_to_params(_strip_head_prefix(state), discriminator_specs(model_cfg), known,
                                             _sizes(model_cfg, False), fallback_params)
    generator = (extras or {}).get(GENERATOR_FOLDER)
    if generator is None:
        params["generator"] = np_tree(fallback_params["generator"])
        report.kept_from_fallback.append(f"{GENERATOR_FOLDER}/ (no {GENERATOR_FOLDER} folder: the whole generator)")
        return params, report
    gen_state, gen_cfg = generator
    _check_generator_config(gen_cfg, model_cfg)
    # The embeddings are the discriminator's: the generator's copies (equal in a released pair) go unused.
    embedding_names = {s.hf_name for s in discriminator_specs(model_cfg) if s.path[0] == "embeddings"}
    gen_params, gen_report = hf_bert.specs_to_params(
        _strip_head_prefix(gen_state), [s for s in generator_specs(model_cfg) if s.path[0] != "embeddings"],
        known | set(TIED_ON_EXPORT) | embedding_names, _sizes(model_cfg, True), fallback_params)
    params["generator"] = gen_params["generator"]
    report.kept_from_fallback.extend(f"{GENERATOR_FOLDER}/{name}" for name in gen_report.kept_from_fallback)
    report.unused.extend(f"{GENERATOR_FOLDER}/{name}" for name in gen_report.unused)
    return params, report


def np_tree(tree):
    """Numpy copies of a (possibly boxed) params subtree."""
    return jax.tree.map(np.asarray, nn.meta.unbox(tree))


CONVERTER = HfConverter(model_type="electra", to_hf=hf_export, from_hf=hf_import,
                        model_config=discriminator_config_from_hf, subfolders=(GENERATOR_FOLDER,),
                        vocab_tensors=VOCAB_TENSORS, classifier_head=CLASSIFIER_HEAD)
