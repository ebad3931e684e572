"""A fine-tuned run -> a Hugging Face folder that AutoModelFor{SequenceClassification, TokenClassification,
QuestionAnswering} loads, with `id2label`, giving our logits; a sentence-embedding run -> a
sentence-transformers folder.

    python -m bert_jax.finetune.hf_export --workdir=DIR --out=OUT

The encoder goes through the family's own `hf_export` hook (the pre-training heads it also
writes are dropped: only tensors under the encoder's prefix are kept); the task head is
renamed to Hugging Face's: `classifier` on the pooled [CLS] for a family with a pooler, the
family's `hf_classifier_head` names for one without (RobertaClassificationHead's `classifier.dense`
+ `classifier.out_proj` by default), `classifier` on every token for tagging, `qa_outputs` for
span QA. A family whose HF task classes hold heads ours are not (`hf_task_heads_missing`) fails, saying so.
"""
import json

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import app, flags, logging

from bert_jax.checkpoint import hf_folder
from bert_jax.families import get_family
from bert_jax.finetune import init_from
from bert_jax.finetune.model import build_finetune_model
from bert_jax.storage import paths

HF_TASK_CLASS = {"classification": "ForSequenceClassification", "regression": "ForSequenceClassification",
                 "token_classification": "ForTokenClassification", "span_qa": "ForQuestionAnswering"}


def load_finetuned(workdir: str):
    """(model, params as numpy, config, label names) of a fine-tuning workdir: its best params if early
    stopping kept some, else its newest checkpoint's."""
    root = paths.path(workdir)
    if not (root / "config.json").exists():
        raise ValueError(f"{root / 'config.json'} does not exist: --workdir must be a fine-tuning run's directory")
    config = ml_collections.ConfigDict(json.loads((root / "config.json").read_text()))
    names = json.loads((root / "labels.json").read_text()) if (root / "labels.json").exists() else []
    family = get_family(config.model.family)
    num_outputs = {"regression": 1, "span_qa": 2}.get(config.task.kind, max(len(names), 1))
    model = build_finetune_model(family, config.model, config.task, num_outputs)
    if (root / "best" / "params").exists():
        params = ocp.StandardCheckpointer().restore(paths.absolute(root / "best" / "params"))
    else:
        manager = ocp.CheckpointManager(paths.absolute(root / "checkpoints"),
                                        item_handlers={"state": ocp.StandardCheckpointHandler()})
        step = manager.latest_step()
        if step is None:
            raise ValueError(f"{root / 'checkpoints'} holds no checkpoint")
        params = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]["params"]
        manager.close()
    return model, jax.tree.map(np.asarray, jax.device_get(params)), config, names


def _merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for key, value in update.items():
        out[key] = _merge(base[key], value) if isinstance(value, dict) and key in base else value
    return out


def _linear(state: dict, name: str, dense: dict) -> None:
    state[f"{name}.weight"] = np.ascontiguousarray(np.asarray(dense["kernel"], np.float32).T)
    state[f"{name}.bias"] = np.asarray(dense["bias"], np.float32)


def hf_task_state(params: dict, config, names: list[str]) -> tuple[dict, dict]:
    """(HF state dict, config.json) of the fine-tuned model."""
    kind = config.task.kind
    if kind not in HF_TASK_CLASS:
        raise ValueError(f"config.task.kind={kind!r} has no Hugging Face task class to export to")
    if kind in ("classification", "regression") and config.task.pooling != "cls":
        raise ValueError("config.task.pooling=mean has no Hugging Face ForSequenceClassification counterpart "
                         "(they pool [CLS]); fine-tune with pooling=cls to export")
    family = get_family(config.model.family)
    if family.hf_task_heads_missing:
        raise ValueError(f"config.model.family={family.name!r}: a fine-tuned {kind} head does not export to "
                         f"Hugging Face: {family.hf_task_heads_missing}")
    state, hf_cfg, base_arch = encoder_state(params, config)
    head = params["head"]
    if "qa_outputs" in head:
        _linear(state, "qa_outputs", head["qa_outputs"])
    elif "pooler" in head:
        spec = family.hf_classifier_head
        _linear(state, spec.dense, head["pooler"])
        _linear(state, spec.classifier, head["classifier"])
        hf_cfg = dict(hf_cfg, **dict(spec.config))
    else:
        _linear(state, "classifier", head["classifier"])
    hf_cfg = dict(hf_cfg, architectures=[base_arch + HF_TASK_CLASS[kind]])
    if kind == "regression":
        hf_cfg.update(num_labels=1, problem_type="regression")
    elif kind != "span_qa":
        hf_cfg.update(id2label={str(i): n for i, n in enumerate(names)}, label2id={n: i for i, n in enumerate(names)})
        if kind == "classification":
            hf_cfg["problem_type"] = "single_label_classification"
    return state, hf_cfg


def encoder_state(params: dict, config) -> tuple[dict, dict, str]:
    """(HF state dict of the encoder alone, its config.json, the HF base-model name, e.g. "Bert")."""
    family = get_family(config.model.family)
    if family.hf_export is None:
        raise ValueError(f"config.model.family={family.name!r} has no Hugging Face export")
    full = _merge(init_from.zeros_like_family_params(family, config.model), params["backbone"])
    exported = family.hf_export(full, config.model)  # its subfolders (a generator) are not the encoder's
    state, hf_cfg = exported.state, exported.config
    embedding = next(k for k in state if k.startswith("embeddings.") or ".embeddings." in k)
    prefix = embedding[: embedding.index("embeddings.")]
    base = hf_cfg.get("architectures", ["Model"])[0].split("For")[0].removesuffix("Model")
    return {k: v for k, v in state.items() if k.startswith(prefix)}, hf_cfg, base


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


def export(workdir: str, out: str) -> None:
    """A sentence-embedding run -> a sentence-transformers folder; any other kind -> an HF task folder."""
    _, params, config, names = load_finetuned(workdir)
    tokenizer_dir = str(paths.path(workdir) / "tokenizer")
    if config.task.kind == "sentence_embedding":
        write_sentence_transformers(out, params, config, tokenizer_dir)
        logging.info("exported %s as a sentence-transformers folder to %s", workdir, out)
        return
    state, hf_cfg = hf_task_state(params, config, names)
    hf_folder.write_hf_folder(out, state, hf_cfg, tokenizer_dir, model_max_length=config.data.max_seq_length)
    logging.info("exported %s (%s) to %s", workdir, hf_cfg["architectures"][0], out)


def _main(argv) -> None:
    del argv
    export(flags.FLAGS.workdir, flags.FLAGS.out)


def main() -> None:
    flags.DEFINE_string("workdir", None, "The fine-tuning run's directory.")
    flags.DEFINE_string("out", None, "Directory to write the Hugging Face folder to.")
    flags.mark_flags_as_required(["workdir", "out"])
    app.run(_main)


if __name__ == "__main__":
    main()
