"""The model-family registry: the only place that knows family names.

A family is a module builder, an objective and its Hugging Face converter, wired here,
above both `bert_jax.models` (pure modules) and `bert_jax.checkpoint` (converters), so
neither imports the other. The train loop asks the registry for `config.model.family`
and never branches on the name. A new family: a model file, a converter file, its
configs, and one `register_family` call below, which declares what its parameters are (`ParamRoles`);
tests/test_family_conformance.py then checks it like every other, with no table to edit.
"""
import dataclasses
from typing import Any, Callable

import flax.linen as nn

from bert_jax.hf import (albert as hf_albert, bert as hf_bert, deberta_v3 as hf_deberta_v3,
                         distilbert as hf_distilbert, electra as hf_electra, modernbert as hf_modernbert, roberta as hf_roberta)
from bert_jax.models import albert, bert, deberta_v3, distilbert, electra, modernbert, roberta
from bert_jax.objectives import replaced_token_detection
from bert_jax.hf.exported import HfExport
from bert_jax.models.param_roles import ParamRoles
from bert_jax.objectives.objective import Objective
from bert_jax.objectives.pretraining import ALBERT_PRETRAINING, BERT_PRETRAINING, MLM_PRETRAINING


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
class Family:
    name: str
    # config.model -> an EncoderModel (bert_jax.models.layers): __call__(batch, deterministic) -> outputs, and
    # encode(batch, deterministic) -> {"hidden": [batch, length, hidden], "pooled": [batch, hidden] where the
    # module has the pooler `roles` declares}, the encoder without pre-training heads, for task heads.
    build_model: Callable[..., nn.Module]
    # An Objective, or config.model -> Objective for one that reads config (ELECTRA's lambda); see objective_for.
    objective: Objective | Callable[[Any], Objective]
    # What each parameter is: lookup tables (perf's FLOPs), depth (layer-wise decay, freezing), the pooler.
    roles: ParamRoles = ParamRoles()
    # Optional Hugging Face interop (bert_jax.export, config.init_from_hf); None: the family has none.
    # hf_export(params, model_cfg) -> HfExport (the main folder's state dict and config.json, and subfolders)
    hf_export: Callable[..., HfExport] | None = None
    # hf_import(state dict, HF config.json dict, model_cfg, fallback_params) -> (params, report with
    # .kept_from_fallback and .unused lists of HF tensor names)
    hf_import: Callable[..., tuple[dict, Any]] | None = None
    # Optional checks of the family's own config keys, run by config validation before anything compiles:
    # validate_config(config) raises ValueError naming the key.
    validate_config: Callable[..., None] | None = None
    # Folders a family's HF export holds beside the main one (ELECTRA: its generator, as `generator/`):
    # hf_export's HfExport.subfolders {name: (state dict, config.json)}, and hf_import gets
    # `extras={name: (state dict, config.json)}` for each such subfolder the imported folder has.
    hf_subfolders: tuple[str, ...] = ()

    # Reading an HF folder of this family without a config of ours (bert_jax.finetune's init_from):
    # its config.json `model_type`, and hf_model_config(config.json dict) -> config.model values.
    hf_model_type: str = ""
    hf_model_config: Callable[[dict], dict] | None = None
    # Fine-tuned task heads: the sequence head a family without a pooler trains and exports (see HfClassifierHead);
    # hf_task_heads_missing, when set, says why no HF task class takes our heads (their export then fails with it).
    hf_classifier_head: HfClassifierHead = HfClassifierHead()
    hf_task_heads_missing: str = ""
    # Vocabulary extension (bert_jax.vocab): {folder ("" the main one, or a subfolder such as `generator`): HF
    # names of its tensors indexed by token id}; empty: the family's vocabulary cannot be extended.
    hf_vocab_tensors: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def objective_for(self, model_cfg) -> Objective:
        """The objective a run of `config.model` trains: the loop, eval and validation ask this."""
        return self.objective if isinstance(self.objective, Objective) else self.objective(model_cfg)


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> None:
    if family.name in _FAMILIES:
        raise ValueError(f"model family {family.name!r} is registered twice")
    _FAMILIES[family.name] = family


def known_families() -> list[str]:
    return sorted(_FAMILIES)


def get_family(name: str) -> Family:
    if name not in _FAMILIES:
        raise ValueError(f"config.model.family={name!r} is unknown; known families: {', '.join(known_families())}")
    return _FAMILIES[name]


def model_for(model_cfg) -> nn.Module:
    """The family module that `model_cfg` (a config.model) describes."""
    return get_family(model_cfg.family).build_model(model_cfg)


def family_of_hf_config(hf_cfg: dict, where: str) -> Family:
    """The registered family whose `hf_model_type` is config.json's `model_type`; `where` names the folder."""
    for family in _FAMILIES.values():
        if family.hf_model_type and family.hf_model_type == hf_cfg.get("model_type"):
            return family
    types = sorted(f.hf_model_type for f in _FAMILIES.values() if f.hf_model_type)
    raise ValueError(f"{where}: config.json model_type={hf_cfg.get('model_type')!r} is no registered family's; "
                     f"known: {', '.join(types)}")


def _register_builtin_families() -> None:
    mlm_head = ParamRoles().top
    for name, build, objective, converter, roles in (
        ("bert", bert.build_bert, BERT_PRETRAINING, hf_bert,
         ParamRoles(top=("pooler", "nsp") + mlm_head, pooler="pooler")),
        ("roberta", roberta.build_roberta, MLM_PRETRAINING, hf_roberta, ParamRoles()),
        # ALBERT's layer groups are shared across depths: no one depth fits them, so they take the top rate.
        ("albert", albert.build_albert, ALBERT_PRETRAINING, hf_albert,
         ParamRoles(embeddings=("embeddings", "embedding_hidden_mapping_in"),
                    top=("group_*", "pooler", "sop") + mlm_head, pooler="pooler", shared_layers=("group_*",))),
        ("distilbert", distilbert.build_distilbert, MLM_PRETRAINING, hf_distilbert, ParamRoles()),
    ):
        register_family(Family(name=name, build_model=build, objective=objective, roles=roles,
                               hf_export=converter.hf_export, hf_import=converter.hf_import,
                               hf_model_type=name, hf_model_config=converter.model_config_from_hf,
                               hf_classifier_head=HfClassifierHead(**getattr(converter, "CLASSIFIER_HEAD", {})),
                               hf_vocab_tensors=getattr(converter, "VOCAB_TENSORS", {})))

    # HF layer 0 (no attention norm) is `first_layer`, outside the scanned stack of the other num_layers - 1.
    modernbert_roles = ParamRoles(embeddings=("word", "embedding_norm"), single_layers=("first_layer",),
                                  top=("final_norm", "head_dense", "head_norm", "mlm_output_bias"))
    register_family(Family(name="modernbert", build_model=modernbert.build_modernbert, objective=MLM_PRETRAINING,
                           roles=modernbert_roles,
                           hf_export=hf_modernbert.hf_export, hf_import=hf_modernbert.hf_import,
                           validate_config=modernbert.validate_config, hf_model_type=hf_modernbert.MODEL_TYPE,
                           hf_model_config=hf_modernbert.model_config_from_hf,
                           hf_task_heads_missing=hf_modernbert.TASK_HEADS_MISSING,
                           hf_vocab_tensors=hf_modernbert.VOCAB_TENSORS))

    electra_roles = ParamRoles(embeddings=("embeddings", "embeddings_project"),
                               top=("rtd_transform", "rtd_output") + mlm_head)
    # GDES: the discriminator reads the generator's `word` table plus its own `delta`: both are embeddings. The
    # generator, which fine-tuning never runs and whose stack is shallower, is one block at the top.
    deberta_roles = ParamRoles(embedding_tables=ParamRoles().embedding_tables + ("delta",),
                               embeddings=("word", "discriminator_word", "token_type", "embedding_norm",
                                           "rel_embeddings"),
                               top=("generator", "rel_norm", "rtd_norm", "rtd_transform", "rtd_output"))
    register_family(Family(name="electra", build_model=electra.build_electra, roles=electra_roles,
                           objective=replaced_token_detection.objective_for, hf_export=hf_electra.hf_export,
                           hf_import=hf_electra.hf_import, hf_subfolders=(hf_electra.GENERATOR_FOLDER,),
                           hf_model_type="electra", hf_model_config=hf_electra.discriminator_config_from_hf,
                           hf_classifier_head=HfClassifierHead(**hf_electra.CLASSIFIER_HEAD),
                           hf_vocab_tensors=hf_electra.VOCAB_TENSORS))
    register_family(Family(name="deberta_v3", build_model=deberta_v3.build_deberta_v3, roles=deberta_roles,
                           objective=replaced_token_detection.objective_for,
                           hf_export=hf_deberta_v3.hf_export, hf_import=hf_deberta_v3.hf_import,
                           hf_subfolders=(hf_deberta_v3.GENERATOR_FOLDER,),
                           hf_model_type="deberta-v2", hf_model_config=hf_deberta_v3.model_config_from_hf,
                           hf_classifier_head=HfClassifierHead(**hf_deberta_v3.CLASSIFIER_HEAD),
                           hf_vocab_tensors=hf_deberta_v3.VOCAB_TENSORS))


_register_builtin_families()
