"""The model-family registry: the only place that knows family names.

A family is a module builder, an objective and its Hugging Face converter, wired here,
above both `bert_jax.models` (pure modules) and `bert_jax.hf` (converters, each one typed
`HfConverter` value), so neither imports the other. The train loop asks the registry for `config.model.family`
and never branches on the name. A new family: a model file, a converter file, its
configs, and one `register_family` call below, which declares what its parameters are (`ParamRoles`);
tests/test_family_conformance.py then checks it like every other, with no table to edit.
"""
import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import ml_collections

import bert_jax

from bert_jax.hf import albert as hf_albert
from bert_jax.hf import bert as hf_bert
from bert_jax.hf import deberta_v3 as hf_deberta_v3
from bert_jax.hf import distilbert as hf_distilbert
from bert_jax.hf import electra as hf_electra
from bert_jax.hf import modernbert as hf_modernbert
from bert_jax.hf import roberta as hf_roberta
from bert_jax.hf import spanbert as hf_spanbert
from bert_jax.hf.converter import HfConverter
from bert_jax.registry import Registry
from bert_jax.models import albert, bert, deberta_v3, distilbert, electra, modernbert, roberta, spanbert
from bert_jax.models.attention import KernelChoice, choose_kernel
from bert_jax.objectives import replaced_token_detection, span_boundary
from bert_jax.objectives.causal_lm import CAUSAL_LM
from bert_jax.models import parametrization
from bert_jax.models.param_roles import ParamRoles
from bert_jax.models.probe import abstract_params
from bert_jax.models.unread import Unread
from bert_jax.objectives.objective import Objective
from bert_jax.objectives.pretraining import ALBERT_PRETRAINING, BERT_PRETRAINING, MLM_PRETRAINING
from bert_jax.parallel.context import check_score_bias


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    # config.model -> an EncoderModel (bert_jax.models.layers): __call__(batch, deterministic) -> outputs, and
    # encode(batch, deterministic) -> {"hidden": [batch, length, hidden], "pooled": [batch, hidden] where the
    # module has the pooler `roles` declares}, the encoder without pre-training heads, for task heads.
    build_model: Callable[..., nn.Module]
    # An Objective, or config.model -> Objective for one that reads config (ELECTRA's lambda); see objective_for.
    objective: Objective | Callable[[Any], Objective]
    # Objectives config.model.objective may name instead ("" = `objective`), on the same module and parameters:
    # ModernBERT's "clm" (bert_jax/objectives/causal_lm.py) and "mlm", the two a biphasic run switches between.
    objectives: dict[str, Objective] = dataclasses.field(default_factory=dict)
    # What each parameter is: lookup tables (perf's FLOPs), depth (layer-wise decay, freezing), the pooler.
    roles: ParamRoles = ParamRoles()
    # config.model -> the attention kernel it resolves to, or a ValueError naming the key: the rule every model's
    # from_config applies, with what this family's model adds (a sliding window; a kernel that drops attention
    # probabilities itself). Config validation and the train program ask it.
    kernel_choice: Callable[..., KernelChoice] = choose_kernel
    # Optional checks of the family's own config keys, run by config validation before anything compiles:
    # validate_config(config) raises ValueError naming the key.
    validate_config: Callable[..., None] | None = None
    # config.model keys its module leaves unread, always or in a mode (bert_jax/models/unread.py): config validation
    # refuses another value than the one that does nothing; tests/test_family_keys.py finds every other key read.
    unread: tuple[Unread, ...] = ()
    # Its Hugging Face conversion (bert_jax/hf/X.py's CONVERTER): export, init_from, fine-tuned heads and
    # vocabulary extension read it; None: the family has none.
    hf: HfConverter | None = None

    def to_hf(self, params, model_cfg):
        """The HfExport of `params` (this family's, for `model_cfg`): under μP the attention logits' multiplier is
        folded into the query projection first, so plain transformers computes the logits this model does."""
        multiplier = parametrization.attention_multiplier(model_cfg)
        return self.hf.to_hf(parametrization.fold_attention(params, multiplier, self.roles), model_cfg)

    def objective_for(self, model_cfg) -> Objective:
        """The objective a run of `config.model` trains: the loop, eval and validation ask this."""
        name = model_cfg.get("objective", "")
        if name:
            if name not in self.objectives:
                known = ", ".join(repr(n) for n in ("", *self.objectives))
                raise bert_jax.UserError(f"config.model.objective={name!r}: family {self.name!r} trains {known} "
                                         f"('' = its own objective)")
            return self.objectives[name]
        return self.objective if isinstance(self.objective, Objective) else self.objective(model_cfg)


FAMILIES: Registry[Family] = Registry("config.model.family", "families")


def register_family(family: Family) -> None:
    FAMILIES.register(family.name, family)


def known_families() -> list[str]:
    return sorted(FAMILIES.names())


def get_family(name: str) -> Family:
    return FAMILIES.get(name)


def model_for(model_cfg) -> nn.Module:
    """The family module that `model_cfg` (a config.model) describes."""
    return get_family(model_cfg.family).build_model(model_cfg)


def abstract_params_for(model_cfg) -> dict:
    """The parameters of the module `model_cfg` (a config.model, or its dict) describes, as ShapeDtypeStructs, nothing
    allocated. Built with the reference kernel: shapes do not depend on it, and it builds on any host."""
    return abstract_params(model_for(ml_collections.ConfigDict(dict(model_cfg, attention_impl="xla"))))


def mup_multipliers(model_cfg) -> parametrization.Multipliers | None:
    """μP's multipliers for the module `model_cfg` describes (bert_jax/models/parametrization.py); None under the
    standard parametrization. Each parameter's role comes from its shapes at this width and at twice it."""
    if not parametrization.is_mup(model_cfg):
        return None
    roles = get_family(model_cfg["family"]).roles
    return parametrization.multipliers(model_cfg, abstract_params_for(model_cfg),
                                       abstract_params_for(parametrization.widened(model_cfg, roles)), roles)


def family_of_hf_config(hf_cfg: dict, where: str) -> Family:
    """The registered family whose `hf.model_type` is config.json's `model_type`; `where` names the folder."""
    for _, family in FAMILIES.items():
        if family.hf is not None and hf_cfg.get("model_type") in (family.hf.model_type, *family.hf.also_reads):
            return family
    types = sorted(f.hf.model_type for _, f in FAMILIES.items() if f.hf is not None)
    raise ValueError(f"{where}: config.json model_type={hf_cfg.get('model_type')!r} is no registered family's; "
                     f"known: {', '.join(types)}")


# The keys a family leaves unread. models/transformer.py's stack: the per-step masks are drawn before the layers,
# which then have no fused dropout-and-norm to run.
PER_STEP_MASKS = Unread.of(when=("dropout_masks", "per_step"), fused_dropout_norm=False)
# Nor is there a dropout to fuse with the norm when the hidden dropout rate is 0 (crammed-style recipes).
NO_DROPOUT = Unread.of(when=("dropout_rate", 0.0), fused_dropout_norm=False)
# A stack of the family's own (DeBERTa-v3's disentangled attention, ModernBERT's pre-LN layers): none of the
# transformer stack's options.
OWN_LAYERS = Unread.of(dropout_masks="per_layer", fused_dropout_norm=False, fused_qkv=False)
NO_TOKEN_TYPES = Unread.of(type_vocab_size=2)
# Every family's: an unrolled stack (scan_layers=False) has no scanned loop to unroll
# (transformer.layers_per_iteration), and the standard parametrization no base width (width_multiplier is 1 there).
UNROLLED = Unread.of(when=("scan_layers", False), scan_unroll=1, unroll_on_gpu=True)
STANDARD = Unread.of(when=("parametrization", "standard"), mup_base_width=0)
EVERY_FAMILY = (UNROLLED, STANDARD)


def _register_builtin_families() -> None:
    mlm_head = ParamRoles().top
    register_family(Family(name="bert", build_model=bert.build_bert, objective=BERT_PRETRAINING, hf=hf_bert.CONVERTER,
                           roles=ParamRoles(top=("pooler", "nsp") + mlm_head, pooler="pooler"),
                           unread=(PER_STEP_MASKS, NO_DROPOUT, *EVERY_FAMILY)))
    register_family(Family(name="roberta", build_model=roberta.build_roberta, objective=MLM_PRETRAINING,
                           hf=hf_roberta.CONVERTER, unread=(PER_STEP_MASKS, NO_DROPOUT, *EVERY_FAMILY)))
    # ALBERT's layer groups are shared across depths: no one depth fits them, so they take the top rate.
    register_family(Family(name="albert", build_model=albert.build_albert, objective=ALBERT_PRETRAINING,
                           hf=hf_albert.CONVERTER,
                           roles=ParamRoles(embeddings=("embeddings", "embedding_hidden_mapping_in"),
                                            top=("group_*", "pooler", "sop") + mlm_head, pooler="pooler",
                                            shared_layers=("group_*",)),
                           unread=(Unread.of(dropout_masks="per_layer"),  # its shared groups draw per layer
                                   NO_DROPOUT, *EVERY_FAMILY)))
    # SpanBERT: BERT without NSP or pooler, plus the span boundary head (its position table a lookup, its decoder
    # tied to the word table and feeding on its last norm, as the MLM head's).
    register_family(Family(name="spanbert", build_model=functools.partial(spanbert.build_spanbert,
                                                                        boundary_head=span_boundary.head_for),
                           objective=span_boundary.objective_for,
                           hf=hf_spanbert.CONVERTER, validate_config=spanbert.validate_config,
                           roles=ParamRoles(embedding_tables=ParamRoles().embedding_tables + ("output_bias",),
                                            top=mlm_head + (spanbert.SBO_HEAD,),
                                            readout_inputs=("mlm_norm", "norm_2")),
                           unread=(PER_STEP_MASKS, NO_DROPOUT, *EVERY_FAMILY)))
    register_family(Family(name="distilbert", build_model=distilbert.build_distilbert, objective=MLM_PRETRAINING,
                           hf=hf_distilbert.CONVERTER,
                           unread=(PER_STEP_MASKS, NO_DROPOUT, NO_TOKEN_TYPES, *EVERY_FAMILY)))

    # HF layer 0 (no attention norm) is `first_layer`, outside the scanned stack of the other num_layers - 1.
    modernbert_roles = ParamRoles(embeddings=("word", "embedding_norm"), single_layers=("first_layer",),
                                  top=("final_norm", "head_dense", "head_norm", "mlm_output_bias"),
                                  readout_inputs=("head_norm",), query=("Wqkv",), query_slice=(-3, 0))
    register_family(Family(name="modernbert", build_model=modernbert.build_modernbert, objective=MLM_PRETRAINING,
                           objectives={"mlm": MLM_PRETRAINING, "clm": CAUSAL_LM},
                           roles=modernbert_roles, validate_config=modernbert.validate_config,
                           kernel_choice=modernbert.ModernBertConfig.kernel_choice,
                           hf=hf_modernbert.CONVERTER, unread=(OWN_LAYERS, NO_TOKEN_TYPES, *EVERY_FAMILY)))

    # ELECTRA's embedding size grows with the width (E = H from base up), ALBERT's stays 128 at every size.
    electra_roles = ParamRoles(embeddings=("embeddings", "embeddings_project"),
                               width_keys=ParamRoles().width_keys + ("embedding_size",),
                               top=("rtd_transform", "rtd_output") + mlm_head)
    # GDES: the discriminator reads the generator's `word` table plus its own `delta`: both are embeddings. The
    # generator, which fine-tuning never runs and whose stack is shallower, is one block at the top.
    deberta_roles = ParamRoles(embedding_tables=ParamRoles().embedding_tables + ("delta",),
                               embeddings=("word", "discriminator_word", "token_type", "embedding_norm",
                                           "rel_embeddings"),
                               top=("generator", "rel_norm", "rtd_norm", "rtd_transform", "rtd_output"))
    register_family(Family(name="electra", build_model=electra.build_electra, roles=electra_roles,
                           objective=replaced_token_detection.objective_for, hf=hf_electra.CONVERTER,
                           unread=(PER_STEP_MASKS, NO_DROPOUT, *EVERY_FAMILY)))
    register_family(Family(name="deberta_v3", build_model=deberta_v3.build_deberta_v3, roles=deberta_roles,
                           kernel_choice=deberta_v3.DebertaV3Config.kernel_choice,
                           # Disentangled attention's position terms are a [query, key] score bias: the context
                           # axis splits them by its all-gather only.
                           validate_config=functools.partial(
                               check_score_bias, terms="disentangled attention's position terms (DeBERTa-v3)"),
                           objective=replaced_token_detection.objective_for, hf=hf_deberta_v3.CONVERTER,
                           unread=(OWN_LAYERS, *EVERY_FAMILY)))


_register_builtin_families()
