"""SpanBERT parameters <-> a Hugging Face `BertForMaskedLM`, as SpanBERT's released checkpoints load.

The encoder and MLM head take BERT's names (bert_jax/hf/bert.py); there is no pooler and no NSP head. The
span boundary head (`span_boundary/...`) is pre-training only: the export leaves it out, as the released
checkpoints do, and an import takes it from the fallback parameters (a fresh initialisation), reporting it.
"""
import flax.linen as nn
import jax
import numpy as np

from bert_jax.hf import bert as hf_bert
from bert_jax.hf.converter import HfConverter
from bert_jax.hf.exported import HfExport
from bert_jax.models.spanbert import SBO_HEAD  # the head's subtree, which no Hugging Face class holds


def tensor_specs(model_cfg) -> list[hf_bert.TensorSpec]:
    """Every tensor of a BertForMaskedLM with `config.model`'s sizes, in Hugging Face order."""
    h, v = model_cfg.hidden_size, model_cfg.vocab_size
    specs = hf_bert.encoder_specs(model_cfg, "bert")
    hf_bert.add_dense(specs, "cls.predictions.transform.dense", "mlm_transform", hf_bert.LINEAR, (h, h), hf_bert.HEAD)
    hf_bert.add_norm(specs, "cls.predictions.transform.LayerNorm", "mlm_norm", h, hf_bert.HEAD)
    hf_bert.add_tensor(specs, "cls.predictions.bias", "mlm_output_bias", hf_bert.COPY, (v,), hf_bert.HEAD)
    return specs


def hf_config(model_cfg, pad_token_id: int = 0) -> dict:
    return hf_bert.config_json(model_cfg, hf_bert.CONFIG_KEYS, model_type="bert", architectures=["BertForMaskedLM"],
                               hidden_act="gelu", pad_token_id=pad_token_id)


def hf_export(params: dict, model_cfg) -> HfExport:
    """The family hook: the BertForMaskedLM state dict and config.json (the SBO head left out)."""
    return HfExport(hf_bert.specs_to_hf(params, tensor_specs(model_cfg), hf_bert.TIED_ON_EXPORT), hf_config(model_cfg))


def hf_import(state: dict[str, np.ndarray], hf_cfg: dict, model_cfg, fallback_params: dict
              ) -> tuple[dict, hf_bert.ImportReport]:
    """The family hook: our params from a BERT folder (ours, SpanBERT's, or a BertForPreTraining, whose pooler and
    NSP head are reported unused); the SBO head from `fallback_params`."""
    hf_bert.check_config_matches(hf_cfg, model_cfg)
    known = set(hf_bert.TIED_ON_EXPORT) | set(hf_bert.IGNORED_ON_IMPORT)
    params, report = hf_bert.specs_to_params(hf_bert.normalise_hf_names(state), tensor_specs(model_cfg), known,
                                             model_cfg, fallback_params)
    head = nn.meta.unbox(fallback_params)[SBO_HEAD]
    params[SBO_HEAD] = head
    report.kept_from_fallback.extend(f"{SBO_HEAD}/{'/'.join(str(k.key) for k in path)}"
                                     for path, _ in jax.tree_util.tree_flatten_with_path(head)[0])
    return params, report


CONVERTER = HfConverter(model_type="bert", to_hf=hf_export, from_hf=hf_import,
                        model_config=hf_bert.model_config_from_hf, vocab_tensors=hf_bert.VOCAB_TENSORS,
                        pretraining_only=(SBO_HEAD,))
