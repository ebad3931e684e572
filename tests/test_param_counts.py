"""Parameter counts of the full-size configs equal Hugging Face's, model for model.

Both sides count without allocating: ours by `jax.eval_shape` of init, Hugging Face's by
building the torch model on the meta device. The same heads on both sides:
  BERT     ours BertForPreTraining   vs  BertForPreTraining   (encoder + pooler + MLM + NSP)
  RoBERTa  ours RobertaForMaskedLM   vs  RobertaForMaskedLM   (encoder + lm_head, no pooler)
  ALBERT   ours AlbertForPreTraining vs  AlbertForPreTraining (encoder + pooler + MLM + SOP)
  ModernBERT ours ModernBertForMaskedLM vs ModernBertForMaskedLM (encoder + head + decoder bias)
  DistilBERT ours DistilBertForMaskedLM vs DistilBertForMaskedLM (encoder + MLM head, no pooler)
Tied decoders count once on both sides (HF's `parameters()` yields a shared tensor once).
"""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.hf import (albert as hf_albert, bert as hf_bert, distilbert as hf_distilbert,
                         modernbert as hf_modernbert, roberta as hf_roberta)  # noqa: E402
from bert_jax.families import get_family  # noqa: E402

# config file -> (HF model class, our HF config.json writer); the base sizes run by default, the rest with -m slow.
MODELS = {
    "bert_base": ("BertForPreTraining", hf_bert.hf_config),
    "bert_large": ("BertForPreTraining", hf_bert.hf_config),
    "roberta_base": ("RobertaForMaskedLM", hf_roberta.hf_config),
    "roberta_large": ("RobertaForMaskedLM", hf_roberta.hf_config),
    "albert_base": ("AlbertForPreTraining", hf_albert.hf_config),
    "albert_large": ("AlbertForPreTraining", hf_albert.hf_config),
    "albert_xlarge": ("AlbertForPreTraining", hf_albert.hf_config),
    "albert_xxlarge": ("AlbertForPreTraining", hf_albert.hf_config),
    "modernbert_base": ("ModernBertForMaskedLM", hf_modernbert.hf_config),  # 149,655,232
    "modernbert_large": ("ModernBertForMaskedLM", hf_modernbert.hf_config),  # 395,881,664
    "distilbert_base": ("DistilBertForMaskedLM", hf_distilbert.hf_config),
}
SIZES = [name if name.endswith("_base") else pytest.param(name, marks=pytest.mark.slow) for name in sorted(MODELS)]


def our_count(model_cfg) -> int:
    model = get_family(model_cfg.family).build_model(model_cfg)
    batch = {name: jnp.zeros((1, 8), jnp.int32) for name in ("input_ids", "token_type_ids", "attention_mask")}
    batch["masked_positions"] = jnp.zeros((1, 2), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), batch)["params"])
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(shapes)))


def hf_count(class_name: str, hf_cfg: dict) -> int:
    config_class = getattr(transformers, class_name.split("For")[0] + "Config")
    with torch.device("meta"):
        model = getattr(transformers, class_name)(config_class(**hf_cfg))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", SIZES)
def test_full_size_parameter_count_equals_hugging_face(name):
    model_cfg = importlib.import_module(f"bert_jax.configs.{name}").get_config().model
    class_name, hf_config = MODELS[name]
    ours, theirs = our_count(model_cfg), hf_count(class_name, hf_config(model_cfg))
    print(f"{name}: ours {ours:,} vs {class_name} {theirs:,}")
    assert ours == theirs
