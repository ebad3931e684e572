"""The contract between a family and its Hugging Face conversion: one typed value per converter.

Each converter module (`bert_jax/hf/X.py`) ends with `CONVERTER = HfConverter(...)`, and the family
registry (`bert_jax/families.py`) registers it as `Family.hf`. Export, `init_from`, the distillation
teacher, fine-tuned heads and vocabulary extension read a family's conversion only through it, so a
field a converter does not fill is a type error here, not an attribute looked up by name elsewhere.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from bert_jax.hf.exported import HfExport


@dataclasses.dataclass(frozen=True)
class HfClassifierHead:
    """The head Hugging Face's <Family>ForSequenceClassification puts on [CLS] for a family without a pooler:
    dense -> activation -> classifier, in HF's tensor names (RobertaClassificationHead's by default). A
    fine-tuned classifier (bert_jax.finetune) trains this head, and its export is a renaming."""

    dense: str = "classifier.dense"
    classifier: str = "classifier.out_proj"
    activation: str = "tanh"  # a key of bert_jax.finetune.model.HEAD_ACTIVATIONS
    config: tuple[tuple[str, Any], ...] = ()  # config.json values that make HF's head this one


@dataclasses.dataclass(frozen=True)
class HfConverter:
    """A family's Hugging Face conversion, whole."""

    # config.json's `model_type`: how an HF folder is matched to a family without a config of ours.
    model_type: str
    # to_hf(params, model_cfg) -> HfExport: the main folder's state dict and config.json, and its subfolders.
    to_hf: Callable[..., HfExport]
    # from_hf(state dict, config.json dict, model_cfg, fallback_params[, extras]) -> (params, report with
    # .kept_from_fallback and .unused lists of HF tensor names). `extras` = {subfolder: (state, config.json)}
    # for each of `subfolders` the imported folder has; it is passed only to a converter that has subfolders.
    from_hf: Callable[..., tuple[dict, Any]]
    # model_config(config.json dict) -> config.model values (init_from, the teacher).
    model_config: Callable[[dict], dict]
    # Folders an export holds beside the main one (ELECTRA's and DeBERTa-v3's generator, as `generator/`).
    subfolders: tuple[str, ...] = ()
    # {folder ("" the main one, or a subfolder): HF names of its tensors indexed by token id}: what vocabulary
    # extension grows; empty: the family's vocabulary cannot be extended.
    vocab_tensors: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # The sequence head a family without a pooler trains and exports (see HfClassifierHead).
    classifier_head: HfClassifierHead = HfClassifierHead()
    # When set, why no HF task class takes our fine-tuned heads (their export then fails with it).
    task_heads_missing: str = ""
    # Top-level subtrees of our params that serve pre-training only and that the export leaves out, as the
    # family's released checkpoints do (SpanBERT's span boundary head): from_hf takes them from the fallback.
    pretraining_only: tuple[str, ...] = ()
    # Other model_types its import reads (ModernBERT's decoder, "modernbert-decoder", for Ettin's cross-objective
    # training): a folder of one of them is matched to this family too.
    also_reads: tuple[str, ...] = ()
