"""configs/crammed.py exports to a transformers class that loads it unchanged: ModernBertForMaskedLM, with every layer
global, no attention, feed-forward or decoder bias, and the same MLM logits as ours (padding included)."""
import jax
import numpy as np
import pytest
from conftest import random_batch
from hf_parity import gathered, random_params
from numerics import TRANSFORMERS, relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import bert_jax.configs.crammed  # noqa: E402
from bert_jax.families import get_family  # noqa: E402
from bert_jax.hf import folder as hf_folder  # noqa: E402

LENGTH = 16


def micro_model_config():
    """The tiny variant's model keys at micro shapes: 2 layers x 32, 4 heads, a vocabulary of 97."""
    model_cfg = bert_jax.configs.crammed.get_config("tiny").model
    model_cfg.update(vocab_size=97, hidden_size=32, num_heads=4, intermediate_size=48, max_position_embeddings=LENGTH,
                     local_attention=LENGTH, attention_impl="xla")
    return model_cfg


def test_crammed_in_transformers_loads_unchanged_with_our_mlm_logits(tmp_path):
    model_cfg = micro_model_config()
    family = get_family(model_cfg.family)
    model = family.build_model(model_cfg)
    batch = random_batch(1, length=LENGTH)
    params = random_params(model, batch)
    ours = np.asarray(jax.jit(model.apply)({"params": params}, batch)["mlm_logits"])  # 2 s; op by op 7 s
    exported = family.to_hf(params, model_cfg)
    hf_folder.write_hf_folder(str(tmp_path), exported.state, exported.config, tokenizer_dir=None)
    hf_model = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    assert type(hf_model).__name__ == "ModernBertForMaskedLM"
    assert hf_model.config.layer_types == ["full_attention"] * model_cfg.num_layers
    # Cramming's choices reach the export: biases only in the LayerNorms, none in the linears or the decoder.
    biases = sorted(name for name in exported.state if name.endswith(".bias"))
    assert biases and all("norm" in name for name in biases), biases
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor(np.asarray(batch["input_ids"])),
                          attention_mask=torch.tensor(np.asarray(batch["attention_mask"]))).logits.numpy()
    diff = relative_error(ours, gathered(logits, batch["masked_positions"]))
    print(f"crammed: relative error of MLM logits against transformers {diff:.2e}")
    assert diff <= TRANSFORMERS
