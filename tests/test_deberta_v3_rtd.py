"""DeBERTa-v3 as it pre-trains: replaced-token detection with gradient-disentangled embedding sharing (GDES).

The discriminator's loss never reaches the shared table (exactly), its delta takes it; the export is the
discriminator with the merged table, which transformers' DebertaV2Model runs to our hidden states; an
import of a DeBERTa-v3 checkpoint round-trips exactly; each network has its HF model's parameter count.
"""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_parity import random_params
from numerics import TRANSFORMERS, relative_error
from test_replaced_token_detection import micro_batch

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.hf import deberta_v3 as hf_deberta_v3, folder as hf_folder  # noqa: E402
from bert_jax.families import get_family  # noqa: E402
from test_hf_deberta_v3 import deberta_config  # noqa: E402

LENGTH = 12  # micro_batch's; over 4 buckets (exact distances up to 2, log-spaced up to 8)


def rtd_config(**overrides):
    values = dict(vocab_size=64, hidden_size=16, num_heads=2, intermediate_size=32, position_buckets=4,
                  max_relative_positions=8, num_layers=1, generator_num_layers=1, dropout_rate=0.0)
    return deberta_config(**{**values, **overrides})


@pytest.fixture(scope="module")
def model_and_params():
    model_cfg = rtd_config(scan_layers=False)  # unrolled: one layer each compiles faster than two scans
    model = get_family("deberta_v3").build_model(model_cfg)
    return model_cfg, model, random_params(model, micro_batch(), seed=1)


def test_the_discriminator_loss_never_reaches_the_shared_embedding_and_the_delta_takes_it(model_and_params):
    model_cfg, model, params = model_and_params
    objective = get_family("deberta_v3").objective_for(model_cfg)
    batch, rngs = micro_batch(), {"sample": jax.random.key(3)}

    def discriminator_loss(tables):
        outputs = model.apply({"params": {**params, **tables}}, batch, rngs=rngs)
        return objective.sums(outputs, batch)["discriminator_loss"] / objective.weights(batch)["discriminator_loss"]

    # Only the tables and the generator are differentiated: the layers' weight gradients would only
    # lengthen the compilation.
    grads = jax.jit(jax.grad(discriminator_loss))({k: params[k] for k in ("word", "discriminator_word", "generator")})
    np.testing.assert_array_equal(grads["word"]["embedding"], 0)  # exactly: GDES's stop-gradient
    for leaf in jax.tree.leaves(grads["generator"]):
        np.testing.assert_array_equal(leaf, 0)  # and the sample's
    corrupted = np.asarray(model.apply({"params": params}, batch, rngs=rngs)["corrupted_ids"])
    read = np.unique(corrupted[np.asarray(batch["attention_mask"]) > 0])
    delta = np.abs(np.asarray(grads["discriminator_word"]["delta"]))
    assert delta[read].min() > 0  # every token the discriminator read moves its delta row...
    np.testing.assert_array_equal(np.delete(delta, read, axis=0), 0)  # ...and no other


def test_the_generator_has_half_the_layers_and_fails_when_deeper_than_the_discriminator():
    import flax.linen as nn

    model = get_family("deberta_v3").build_model(rtd_config(num_layers=4, generator_num_layers=0))
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), micro_batch()))["params"]
    assert jax.tree.leaves(shapes["generator"]["encoder"]["stack"])[0].shape[0] == 2
    assert jax.tree.leaves(shapes["discriminator"]["encoder"]["stack"])[0].shape[0] == 4
    # The GDES delta starts at zero: the discriminator first reads exactly the generator's table.
    tables = nn.meta.unbox(model.init(jax.random.key(0), jnp.ones((1, 2), jnp.int32),
                                      method=lambda m, ids: m.discriminator_word(ids)))["params"]
    np.testing.assert_array_equal(tables["discriminator_word"]["delta"], 0)
    assert np.abs(tables["word"]["embedding"]).min() > 0
    with pytest.raises(ValueError, match=r"config\.model\.generator_num_layers=5: the generator must be no deeper"):
        get_family("deberta_v3").build_model(rtd_config(num_layers=4, generator_num_layers=5))


def test_export_is_the_discriminator_with_the_merged_table_and_transformers_gives_our_hidden_states(
        model_and_params, tmp_path):
    model_cfg, model, params = model_and_params
    batch = micro_batch(2)
    ours = np.asarray(model.apply({"params": params}, batch, method=lambda m, b: m.discriminator_word(b["input_ids"])))
    merged = params["word"]["embedding"] + params["discriminator_word"]["delta"]
    np.testing.assert_array_equal(ours, np.asarray(merged)[np.asarray(batch["input_ids"])])
    rtd_logits = np.asarray(model.apply({"params": params}, batch, method=lambda m, b: m.discriminator(b, True)))
    exported = get_family("deberta_v3").hf.to_hf(params, model_cfg)
    state, hf_cfg = exported.state, exported.config
    np.testing.assert_array_equal(state["deberta.embeddings.word_embeddings.weight"], merged)
    hf_folder.write_hf_folder(str(tmp_path), state, hf_cfg, tokenizer_dir=None)
    bare = transformers.AutoModel.from_pretrained(str(tmp_path)).eval()
    assert type(bare).__name__ == "DebertaV2Model"
    with torch.no_grad():
        theirs = bare(input_ids=torch.tensor(np.asarray(batch["input_ids"])),
                      attention_mask=torch.tensor(np.asarray(batch["attention_mask"]))).last_hidden_state.numpy()
    # The released checkpoints' head (mask_predictions) on transformers' hidden states gives our logits.
    h = theirs + theirs[:, :1]
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    h = (h - mean) / np.sqrt(var + model_cfg.layer_norm_eps) * state["mask_predictions.LayerNorm.weight"] + state[
        "mask_predictions.LayerNorm.bias"]
    h = np.asarray(jax.nn.gelu(h @ state["mask_predictions.dense.weight"].T + state["mask_predictions.dense.bias"],
                               approximate=False))
    logits = (h @ state["mask_predictions.classifier.weight"].T + state["mask_predictions.classifier.bias"])[..., 0]
    real = np.asarray(batch["attention_mask"]).astype(bool)
    error = relative_error(rtd_logits[real], logits[real])
    print(f"DeBERTa-v3 discriminator export: relative error of replaced-token logits {error:.2e}")
    assert error <= TRANSFORMERS


def test_a_released_deberta_v3_checkpoint_imports_and_exports_back_exactly(model_and_params):
    """A DebertaV2Model folder with mask_predictions and no generator: the table is shared, the delta zero."""
    model_cfg, _, fallback = model_and_params
    torch.manual_seed(0)
    bare = transformers.DebertaV2Model(transformers.DebertaV2Config(**hf_deberta_v3.hf_config(model_cfg)))
    rng = np.random.default_rng(0)
    state = {f"deberta.{k}": v.numpy() for k, v in bare.state_dict().items()}
    state.update({s.hf_name: rng.standard_normal(s.hf_shape).astype(np.float32)
                  for s in hf_deberta_v3.discriminator_specs(model_cfg) if s.hf_name.startswith("mask_predictions.")})
    params, report = get_family("deberta_v3").hf.from_hf(state, hf_deberta_v3.hf_config(model_cfg), model_cfg,
                                                        fallback, extras={})
    assert report.unused == [] and len(report.kept_from_fallback) == 1
    assert report.kept_from_fallback[0].startswith("generator/ (no generator folder")
    np.testing.assert_array_equal(params["discriminator_word"]["delta"], 0)
    assert jax.tree.structure(params) == jax.tree.structure(jax.tree.map(np.asarray, fallback))
    again = get_family("deberta_v3").hf.to_hf(params, model_cfg).state
    assert set(again) == set(state)
    for name in sorted(state):
        np.testing.assert_array_equal(again[name], state[name], err_msg=name)


def test_our_export_with_its_generator_folder_imports_back_to_the_same_model(model_and_params):
    model_cfg, _, params = model_and_params
    exported = get_family("deberta_v3").hf.to_hf(params, model_cfg)
    state, hf_cfg, extras = exported.state, exported.config, exported.subfolders
    gen_state, gen_cfg = extras["generator"]
    assert gen_cfg["architectures"] == ["DebertaV2ForMaskedLM"] and gen_cfg["num_hidden_layers"] == 1
    np.testing.assert_array_equal(gen_state["deberta.embeddings.word_embeddings.weight"], params["word"]["embedding"])
    zeros = jax.tree.map(np.zeros_like, jax.tree.map(np.asarray, params))
    again, report = get_family("deberta_v3").hf.from_hf(state, hf_cfg, model_cfg, zeros, extras=extras)
    assert report.kept_from_fallback == [] and report.unused == []
    for part in ("word", "generator", "discriminator"):
        jax.tree.map(np.testing.assert_array_equal, again[part], jax.tree.map(np.asarray, params[part]))
    # The delta comes back as merged - shared: the exported delta up to one float32 rounding.
    np.testing.assert_allclose(again["discriminator_word"]["delta"], params["discriminator_word"]["delta"],
                               rtol=0, atol=1e-6 * np.abs(state["deberta.embeddings.word_embeddings.weight"]).max())
    with pytest.raises(ValueError, match=r"generator_num_layers gives the generator 1 layers but generator/"
                                         r"config\.json says num_hidden_layers=2"):
        get_family("deberta_v3").hf.from_hf(state, hf_cfg, model_cfg, zeros, extras={
            "generator": (gen_state, {**gen_cfg, "num_hidden_layers": 2})})


@pytest.mark.parametrize("name", ["deberta_v3_base"] + [pytest.param(n, marks=pytest.mark.slow) for n in (
    "deberta_v3_xsmall", "deberta_v3_small", "deberta_v3_large")])
def test_each_network_has_its_hugging_face_models_parameter_count(name):
    """Discriminator (with the table) = DebertaV2Model + mask_predictions; generator (with the table) =
    DebertaV2ForMaskedLM at its depth; counted by eval_shape and on torch's meta device."""
    model_cfg = importlib.import_module(f"bert_jax.configs.{name}").get_config().model
    model = get_family("deberta_v3").build_model(model_cfg)
    batch = {k: jnp.zeros((1, 8), jnp.int32) for k in ("input_ids", "attention_mask", "masked_ids", "masked_positions")}
    batch["masked_weights"] = jnp.zeros((1, 8), jnp.float32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), batch)["params"])
    count = lambda tree: int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(tree)))  # noqa: E731
    word, delta = count(shapes["word"]), count(shapes["discriminator_word"])
    h = model_cfg.hidden_size
    head = 2 * h + (h * h + h) + (h + 1)  # mask_predictions: LayerNorm, dense, classifier

    def hf_count(class_name, generator):
        hf_cfg = hf_deberta_v3.hf_config(model_cfg)
        if generator:
            hf_cfg["num_hidden_layers"] = model.config.generator_num_layers
        with torch.device("meta"):
            hf = getattr(transformers, class_name)(transformers.DebertaV2Config(**hf_cfg))
        return sum(p.numel() for p in hf.parameters())

    discriminator, generator = count(shapes["discriminator"]) + word, count(shapes["generator"]) + word
    print(f"{name}: discriminator {discriminator:,}, generator {generator:,} "
          f"({model.config.generator_num_layers} layers), GDES delta {delta:,}")
    assert discriminator == hf_count("DebertaV2Model", False) + head
    assert generator == hf_count("DebertaV2ForMaskedLM", True)
    assert delta == word
