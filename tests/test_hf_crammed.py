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


def packed_batch(seed: int, batch: int = 2, vocab: int = 97) -> dict:
    """Packed rows as the pipeline builds them: documents of 7, 5 and 2 tokens, then padding (segment 0), positions
    restarting per document; 5 predicted positions a row (the last slot of row 1 is padding, weight 0)."""
    rng = np.random.default_rng(seed)
    segments = np.repeat([1, 2, 3, 0], [7, 5, 2, LENGTH - 14])[None].repeat(batch, 0)
    positions = np.concatenate([np.arange(n) for n in (7, 5, 2, LENGTH - 14)])[None].repeat(batch, 0)
    masked = np.stack([np.sort(rng.choice(14, 5, replace=False)) for _ in range(batch)])
    weights = np.ones((batch, 5), np.float32)
    weights[1, -1] = 0.0
    return {"input_ids": (rng.integers(5, vocab, (batch, LENGTH)) * (segments > 0)).astype(np.int32),
            "attention_mask": (segments > 0).astype(np.int32), "token_type_ids": np.zeros_like(segments),
            "segment_ids": segments.astype(np.int32), "position_ids": positions.astype(np.int32),
            "masked_positions": masked.astype(np.int32), "masked_ids": rng.integers(5, vocab, (batch, 5)).astype(np.int32),
            "masked_weights": weights}


def test_race_torch_side_computes_our_mlm_loss_on_packed_rows(tmp_path):
    """bench/torch_crammed.py (the first-run race's torch side) runs ModernBertForMaskedLM on bert_jax's packed rows
    with a 4-D document mask, our positions and sparse prediction: its loss must be ours, or the race compares two
    recipes (issue 75)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import torch_crammed

    model_cfg = micro_model_config()
    family = get_family(model_cfg.family)
    model = family.build_model(model_cfg)
    batch = packed_batch(0)
    params = random_params(model, batch)
    logits = jax.jit(model.apply)({"params": params}, batch)["mlm_logits"]
    chosen = np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), batch["masked_ids"][..., None], -1)[..., 0]
    ours = -(chosen * batch["masked_weights"]).sum() / batch["masked_weights"].sum()
    exported = family.to_hf(params, model_cfg)
    hf_folder.write_hf_folder(str(tmp_path), exported.state, exported.config, tokenizer_dir=None)
    hf_model = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path), sparse_prediction=True).eval()
    mask = torch_crammed.document_mask(torch.as_tensor(batch["segment_ids"]))
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.as_tensor(batch["input_ids"]).long(),
                          attention_mask={"full_attention": mask, "sliding_attention": mask},
                          position_ids=torch.as_tensor(batch["position_ids"]).long(),
                          labels=torch.as_tensor(torch_crammed.mlm_labels(batch)))
    print(f"race torch side: MLM loss {theirs.loss.item():.6f} against ours {ours:.6f}")
    assert relative_error(np.float32(ours), theirs.loss.numpy()) <= TRANSFORMERS
