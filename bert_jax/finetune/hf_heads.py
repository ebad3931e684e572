"""A fine-tuned model's tensors in Hugging Face's names: the encoder through its family's own `hf_export`, the task
head renamed to Hugging Face's; and the sentence-transformers folder of an embedding model.

The encoder's pre-training heads, which the family's export also writes, are dropped: only
tensors under the encoder's prefix are kept. A sequence head is `classifier` on the pooled
[CLS] for a family with a pooler, the family's `hf.classifier_head` names for one without
(RobertaClassificationHead's `classifier.dense` + `classifier.out_proj` by default); a tagging
head is `classifier` on every token, span QA's `qa_outputs`. A family whose HF task classes hold
heads ours are not (`hf.task_heads_missing`) fails, saying so.
"""
import json

import numpy as np

from bert_jax.hf import folder as hf_folder
from bert_jax.families import get_family
from bert_jax.finetune import init_from
from bert_jax.storage import paths


def _merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        out[key] = _merge(base[key], value) if isinstance(value, dict) and key in base else value
    return out


def _linear(state: dict, name: str, dense: dict) -> None:
    state[f"{name}.weight"] = np.ascontiguousarray(np.asarray(dense["kernel"], np.float32).T)
    state[f"{name}.bias"] = np.asarray(dense["bias"], np.float32)


def encoder_state(params: dict, config) -> tuple[dict, dict, str]:
    """(HF state dict of the encoder alone, its config.json, the HF base-model name, e.g. "Bert")."""
    family = get_family(config.model.family)
    if family.hf is None:
        raise ValueError(f"config.model.family={family.name!r} has no Hugging Face export")
    full = _merge(init_from.zeros_like_family_params(family, config.model), params["backbone"])
    exported = family.to_hf(full, config.model)  # its subfolders (a generator) are not the encoder's
    state, hf_cfg = exported.state, exported.config
    embedding = next(k for k in state if k.startswith("embeddings.") or ".embeddings." in k)
    prefix = embedding[: embedding.index("embeddings.")]
    base = hf_cfg.get("architectures", ["Model"])[0].split("For")[0].removesuffix("Model")
    return {k: v for k, v in state.items() if k.startswith(prefix)}, hf_cfg, base


def task_state(params: dict, config, hf_class: str, head_config: dict) -> tuple[dict, dict]:
    """(HF state dict, config.json) of the encoder with its task head, for `Auto{hf_class}`."""
    family = get_family(config.model.family)
    if family.hf.task_heads_missing:
        raise ValueError(f"config.model.family={family.name!r}: a fine-tuned {config.task.kind} head does not "
                         f"export to Hugging Face: {family.hf.task_heads_missing}")
    state, hf_cfg, base_arch = encoder_state(params, config)
    head = params["head"]
    if "qa_outputs" in head:
        _linear(state, "qa_outputs", head["qa_outputs"])
    elif "pooler" in head:
        spec = family.hf.classifier_head
        _linear(state, spec.dense, head["pooler"])
        _linear(state, spec.classifier, head["classifier"])
        hf_cfg = dict(hf_cfg, **dict(spec.config))
    else:
        _linear(state, "classifier", head["classifier"])
    return state, dict(hf_cfg, architectures=[base_arch + hf_class], **head_config)


def write_sentence_transformers(out: str, params: dict, config, tokenizer_dir: str) -> None:
    """The folder sentence_transformers.SentenceTransformer(out) loads: the encoder as an AutoModel folder,
    modules.json (Transformer, then Pooling), 1_Pooling/config.json and sentence_bert_config.json."""
    state, hf_cfg, base = encoder_state(params, config)
    hf_cfg = dict(hf_cfg, architectures=[f"{base}Model"])
    length = config.data.max_seq_length
    hf_folder.write_hf_folder(out, state, hf_cfg, tokenizer_dir, model_max_length=length)
    root = paths.path(out)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    paths.write_atomically(root / "modules.json", json.dumps(modules, indent=2))
    paths.write_atomically(root / "sentence_bert_config.json",
                           json.dumps({"max_seq_length": length, "do_lower_case": False}, indent=2))
    mean = config.task.pooling == "mean"
    pooling = {"word_embedding_dimension": int(config.model.hidden_size), "pooling_mode_cls_token": not mean,
               "pooling_mode_mean_tokens": mean, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False}
    paths.write_atomically(root / "1_Pooling" / "config.json", json.dumps(pooling, indent=2))
