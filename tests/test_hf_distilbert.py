"""Hugging Face interop for DistilBERT: MLM logits parity with transformers' DistilBertForMaskedLM (padded
batch, scan on and off), exact HF -> ours -> HF round trips, and import errors naming the culprit.

Skipped cleanly without torch / transformers (pip install -e ".[test]" brings both).
"""
import numpy as np
import pytest
from conftest import random_batch, small_model_config
from hf_parity import gathered, random_params
from numerics import TRANSFORMERS, relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.hf import distilbert as hf_distilbert, folder as hf_folder  # noqa: E402
from bert_jax.families import get_family  # noqa: E402


def distilbert_config(**overrides):
    values = dict(family="distilbert", type_vocab_size=1, hidden_act="gelu", pad_token_id=0)
    values.update(overrides)
    return small_model_config(**values)


def exported_model(tmp_path, params, model_cfg):
    exported = get_family("distilbert").hf.to_hf(params, model_cfg)
    state, hf_cfg = exported.state, exported.config
    hf_folder.write_hf_folder(str(tmp_path), state, hf_cfg, tokenizer_dir=None)
    return transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path)).eval()


@pytest.mark.parametrize("scan_layers", [True, False])
def test_distilbert_in_transformers_matches_our_mlm_logits_with_padding(tmp_path, scan_layers):
    model_cfg = distilbert_config(scan_layers=scan_layers)
    model = get_family("distilbert").build_model(model_cfg)
    params = random_params(model, random_batch(0))
    batch = random_batch(1)
    outputs = model.apply({"params": params}, batch)
    ours = np.asarray(outputs["mlm_logits"])
    hf_model = exported_model(tmp_path, params, model_cfg)
    assert type(hf_model).__name__ == "DistilBertForMaskedLM"
    with torch.no_grad():
        out = hf_model(input_ids=torch.tensor(np.asarray(batch["input_ids"])),
                       attention_mask=torch.tensor(np.asarray(batch["attention_mask"])), output_hidden_states=True)
    diff = relative_error(ours, gathered(out.logits.numpy(), batch["masked_positions"]))
    real = np.asarray(batch["attention_mask"]).astype(bool)
    hidden_diff = relative_error(np.asarray(outputs["last_hidden_state"])[real], out.hidden_states[-1].numpy()[real])
    print(f"DistilBERT scan_layers={scan_layers}: relative error of MLM logits {diff:.2e}, "
          f"of last hidden states {hidden_diff:.2e}")
    assert diff <= TRANSFORMERS and hidden_diff <= TRANSFORMERS


@pytest.mark.parametrize("scan_layers", [True, False])
def test_hf_distilbert_to_ours_to_hf_round_trips_every_tensor_exactly(scan_layers):
    model_cfg = distilbert_config(scan_layers=scan_layers)
    torch.manual_seed(0)
    hf_model = transformers.DistilBertForMaskedLM(transformers.DistilBertConfig(**hf_distilbert.hf_config(model_cfg)))
    original = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    params, report = hf_distilbert.hf_to_params(original, model_cfg)
    assert report.kept_from_fallback == [] and report.unused == []
    again = hf_distilbert.params_to_hf(params, model_cfg)
    assert set(original) == set(again)
    for name in sorted(original):
        np.testing.assert_array_equal(again[name], original[name], err_msg=name)


def full_state(model_cfg):
    rng = np.random.default_rng(0)
    return {s.hf_name: rng.standard_normal(s.hf_shape).astype(np.float32)
            for s in hf_distilbert.tensor_specs(model_cfg)}


def test_distilbert_import_errors_name_the_tensor_or_config_key():
    model_cfg = distilbert_config()
    state = full_state(model_cfg)
    del state["distilbert.transformer.layer.1.attention.v_lin.bias"]
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*distilbert\.transformer\.layer\.1\.attention\.v_lin\.bias"):
        hf_distilbert.hf_to_params(state, model_cfg)
    hf_cfg = hf_distilbert.hf_config(model_cfg)
    with pytest.raises(ValueError, match=r"config\.model\.num_layers=2 .* n_layers=3"):
        get_family("distilbert").hf.from_hf(full_state(model_cfg), {**hf_cfg, "n_layers": 3}, model_cfg, None)
    with pytest.raises(ValueError, match="sinusoidal_pos_embds=True"):
        get_family("distilbert").hf.from_hf(full_state(model_cfg), {**hf_cfg, "sinusoidal_pos_embds": True},
                                           model_cfg, None)
    with pytest.raises(ValueError, match=r"config\.model\.layer_norm_eps=1e-05"):
        hf_distilbert.hf_config(distilbert_config(layer_norm_eps=1e-5))


def test_a_distilbert_model_checkpoint_imports_its_encoder_and_keeps_the_fallback_head():
    model_cfg = distilbert_config()
    torch.manual_seed(0)
    bare = transformers.DistilBertModel(transformers.DistilBertConfig(**hf_distilbert.hf_config(model_cfg)))
    state = {k: v.numpy() for k, v in bare.state_dict().items()}
    fallback, _ = hf_distilbert.hf_to_params(full_state(model_cfg), model_cfg)
    params, report = hf_distilbert.hf_to_params(state, model_cfg, fallback_params=fallback)
    assert sorted(report.kept_from_fallback) == sorted(
        s.hf_name for s in hf_distilbert.tensor_specs(model_cfg) if s.part == "head")
    assert report.unused == []
    np.testing.assert_array_equal(params["encoder"]["embeddings"]["word"]["embedding"],
                                  state["embeddings.word_embeddings.weight"])
