"""Hugging Face interop for ALBERT: MLM and SOP logits parity with transformers (shared layer groups, scan on
and off, gelu_new), exact HF -> ours -> HF round trips, and import errors naming the culprit.

Skipped cleanly without torch / transformers (pip install -e ".[test]" brings both).
"""
import numpy as np
import pytest
from conftest import random_batch, small_model_config
from hf_parity import gathered, random_params
from numerics import REORDERED, TRANSFORMERS, assert_close, relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.hf import albert as hf_albert, folder as hf_folder  # noqa: E402
from bert_jax.families import get_family  # noqa: E402
from bert_jax.models.albert import group_repeats  # noqa: E402


def albert_config(**overrides):
    # 3 layers over 2 groups: Hugging Face's rule runs group 0 twice, then group 1 once.
    values = dict(family="albert", embedding_size=16, num_layers=3, num_hidden_groups=2, hidden_act="gelu_new",
                  pad_token_id=0)
    values.update(overrides)
    return small_model_config(**values)


def test_layers_map_to_groups_as_in_hf():
    assert group_repeats(3, 2) == [2, 1]
    assert group_repeats(12, 1) == [12]
    assert group_repeats(12, 3) == [4, 4, 4]
    assert group_repeats(4, 4) == [1, 1, 1, 1]


def test_shared_layers_make_the_parameter_count_independent_of_depth():
    import jax

    def count(num_layers):
        model = get_family("albert").build_model(albert_config(num_layers=num_layers, num_hidden_groups=1))
        shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), random_batch(0))["params"])
        return sum(np.prod(x.shape) for x in jax.tree.leaves(shapes))

    assert count(2) == count(6)


@pytest.mark.parametrize("scan_layers,hidden_act", [(True, "gelu_new"), (False, "gelu_new"), (True, "gelu")])
def test_albert_in_transformers_matches_our_mlm_and_sop_logits(tmp_path, scan_layers, hidden_act):
    model_cfg = albert_config(scan_layers=scan_layers, hidden_act=hidden_act)
    model = get_family("albert").build_model(model_cfg)
    batch = random_batch(1)
    params = random_params(model, batch)
    ours = model.apply({"params": params}, batch)
    exported = get_family("albert").hf.to_hf(params, model_cfg)
    state, hf_cfg = exported.state, exported.config
    hf_folder.write_hf_folder(str(tmp_path), state, hf_cfg, tokenizer_dir=None)
    inputs = {k: torch.tensor(np.asarray(batch[k])) for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        out = transformers.AlbertForPreTraining.from_pretrained(str(tmp_path)).eval()(**inputs)
        masked_lm = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path)).eval()(**inputs).logits
    mlm = gathered(out.prediction_logits.numpy(), batch["masked_positions"])
    mlm_diff = relative_error(np.asarray(ours["mlm_logits"]), mlm)
    sop_diff = relative_error(np.asarray(ours["sop_logits"]), out.sop_logits.numpy())
    auto_diff = relative_error(np.asarray(ours["mlm_logits"]), gathered(masked_lm.numpy(), batch["masked_positions"]))
    print(f"ALBERT scan_layers={scan_layers} {hidden_act}: relative error MLM {mlm_diff:.2e}, SOP {sop_diff:.2e}, "
          f"AutoModelForMaskedLM {auto_diff:.2e}")
    assert mlm_diff <= TRANSFORMERS and sop_diff <= TRANSFORMERS and auto_diff <= TRANSFORMERS


@pytest.mark.parametrize("scan_layers", [True, False])
def test_hf_albert_to_ours_to_hf_round_trips_every_tensor_exactly(scan_layers):
    model_cfg = albert_config(scan_layers=scan_layers)
    torch.manual_seed(0)
    hf_model = transformers.AlbertForPreTraining(transformers.AlbertConfig(**hf_albert.hf_config(model_cfg)))
    original = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    params, report = hf_albert.hf_to_params(original, model_cfg)
    assert report.kept_from_fallback == [] and report.unused == []
    again = hf_albert.params_to_hf(params, model_cfg)
    names = set(original) - set(hf_albert.IGNORED_ON_IMPORT)
    assert names == set(again)
    for name in sorted(names):
        np.testing.assert_array_equal(again[name], original[name], err_msg=name)


def full_state(model_cfg):
    rng = np.random.default_rng(0)
    return {s.hf_name: rng.standard_normal(s.hf_shape).astype(np.float32) for s in hf_albert.tensor_specs(model_cfg)}


def test_albert_import_errors_name_the_tensor_or_config_key():
    model_cfg = albert_config()
    state = full_state(model_cfg)
    del state["albert.encoder.albert_layer_groups.1.albert_layers.0.ffn.weight"]
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*albert_layer_groups\.1\.albert_layers\.0\.ffn\.weight"):
        hf_albert.hf_to_params(state, model_cfg)
    state = full_state(model_cfg)
    state["albert.embeddings.word_embeddings.weight"] = np.zeros((97, 32), np.float32)
    with pytest.raises(ValueError, match=r"albert\.embeddings\.word_embeddings\.weight has shape \(97, 32\)"):
        hf_albert.hf_to_params(state, model_cfg)
    hf_cfg = hf_albert.hf_config(model_cfg)
    family = get_family("albert")
    with pytest.raises(ValueError, match="model_type='roberta'"):
        family.hf.from_hf(full_state(model_cfg), {**hf_cfg, "model_type": "roberta"}, model_cfg, None)
    with pytest.raises(ValueError, match=r"config\.model\.num_hidden_groups=2 .* num_hidden_groups=1"):
        family.hf.from_hf(full_state(model_cfg), {**hf_cfg, "num_hidden_groups": 1}, model_cfg, None)
    with pytest.raises(ValueError, match="inner_group_num=2"):
        family.hf.from_hf(full_state(model_cfg), {**hf_cfg, "inner_group_num": 2}, model_cfg, None)


@pytest.mark.slow  # four compilations of a gradient: ~2 min on a busy 2-core machine
def test_shared_layer_gradients_agree_scanned_unrolled_and_rematerialised():
    """A shared group's gradient sums over every layer that runs it, however the stack is compiled."""
    import jax

    batch = random_batch(2)
    batch["sentence_order_label"] = batch["next_sentence_label"]
    family = get_family("albert")
    params = random_params(family.build_model(albert_config()), batch)

    def grads(**overrides):
        model = family.build_model(albert_config(**overrides))

        def loss(p):
            return family.objective.loss(family.objective.sums(model.apply({"params": p}, batch), batch),
                                         family.objective.weights(batch))

        return jax.jit(jax.grad(loss))(params)

    reference = grads(scan_layers=False)
    for overrides in (dict(scan_layers=True), dict(scan_layers=True, remat_policy="full"),
                      dict(scan_layers=False, remat_policy="full")):
        assert_close(grads(**overrides), reference, REORDERED, str(overrides))  # the same sums in another order


def test_an_albert_model_checkpoint_imports_its_encoder_and_keeps_fallback_heads():
    """AlbertModel folders (no `albert.` prefix, no MLM/SOP heads) import; the heads come from the fallback."""
    model_cfg = albert_config()
    torch.manual_seed(0)
    bare = transformers.AlbertModel(transformers.AlbertConfig(**hf_albert.hf_config(model_cfg)))
    state = {k: v.numpy() for k, v in bare.state_dict().items()}
    assert not any(k.startswith("albert.") for k in state)
    fallback, _ = hf_albert.hf_to_params(full_state(model_cfg), model_cfg)
    params, report = hf_albert.hf_to_params(state, model_cfg, fallback_params=fallback)
    assert sorted(report.kept_from_fallback) == sorted(
        s.hf_name for s in hf_albert.tensor_specs(model_cfg) if s.hf_name.startswith(("predictions.", "sop_classifier.")))
    np.testing.assert_array_equal(params["encoder"]["stack"]["group_1"]["intermediate"]["kernel"],
                                  state["encoder.albert_layer_groups.1.albert_layers.0.ffn.weight"].T)
    np.testing.assert_array_equal(params["sop"]["kernel"], fallback["sop"]["kernel"])
