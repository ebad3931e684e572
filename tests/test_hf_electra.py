"""Hugging Face interop for ELECTRA: discriminator logits against `ElectraForPreTraining`, generator logits against
`ElectraForMaskedLM` (factorised embeddings projected or not, scan on and off, with padding), exact HF -> ours ->
HF round trips of both models, importing with or without the generator folder, and errors naming the culprit.

Skipped cleanly without torch / transformers.
"""
import jax
import numpy as np
import pytest
from conftest import random_batch, small_model_config
from hf_parity import gathered, random_params
from numerics import TRANSFORMERS, relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.hf import electra as hf_electra, folder as hf_folder  # noqa: E402
from bert_jax.families import get_family  # noqa: E402
from bert_jax.models.electra import Electra  # noqa: E402


def electra_config(**overrides):
    # E=16 < H=32 (the discriminator projects), generator 1/4: hidden 8, 1 head, FFN 16 (it projects too).
    values = dict(family="electra", embedding_size=16, generator_size_ratio=0.25, hidden_act="gelu", pad_token_id=0,
                  attention_impl="xla")
    values.update(overrides)
    return small_model_config(**values)


def our_logits(model_cfg, params, batch):
    model = get_family("electra").build_model(model_cfg)
    run = jax.jit(lambda p: (model.apply({"params": p}, batch, method=Electra.discriminator_logits),
                             model.apply({"params": p}, batch, method=Electra.generator_logits)))
    return jax.device_get(run(params))


@pytest.mark.parametrize("embedding_size,scan_layers", [(16, False), pytest.param(32, True, marks=pytest.mark.slow)])
def test_electra_in_transformers_matches_our_discriminator_and_generator_logits(tmp_path, embedding_size, scan_layers):
    model_cfg = electra_config(embedding_size=embedding_size, scan_layers=scan_layers)
    batch = random_batch(1)
    params = random_params(get_family("electra").build_model(model_cfg), batch)
    discriminator, generator = our_logits(model_cfg, params, batch)
    exported = get_family("electra").hf.to_hf(params, model_cfg)
    state, hf_cfg, extras = exported.state, exported.config, exported.subfolders
    hf_folder.write_hf_folder(str(tmp_path), state, hf_cfg, tokenizer_dir=None)
    hf_folder.write_hf_folder(str(tmp_path / "generator"), *extras["generator"], tokenizer_dir=None)
    inputs = {k: torch.tensor(np.asarray(batch[k])) for k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        hf_disc = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path)).eval()(**inputs).logits.numpy()
        hf_gen = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "generator")).eval()(**inputs)
    real = np.asarray(batch["attention_mask"]) > 0  # padded queries differ by design: ours attend only to padding
    disc_diff = relative_error(discriminator[real], hf_disc[real])
    gen_diff = relative_error(generator, gathered(hf_gen.logits.numpy(), batch["masked_positions"]))
    print(f"ELECTRA E={embedding_size} scan_layers={scan_layers}: relative error discriminator {disc_diff:.2e}, "
          f"generator {gen_diff:.2e}")
    assert disc_diff <= TRANSFORMERS and gen_diff <= TRANSFORMERS


def hf_pair(model_cfg, seed: int = 0):
    """Random HF discriminator and generator state dicts sharing their embeddings, as released pairs do."""
    torch.manual_seed(seed)
    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(**hf_electra.hf_config(model_cfg)))
    gen = transformers.ElectraForMaskedLM(transformers.ElectraConfig(**hf_electra.hf_config(model_cfg, True)))
    disc_state = {k: v.numpy() for k, v in disc.state_dict().items()}
    gen_state = {k: v.numpy() for k, v in gen.state_dict().items()}
    for name in gen_state:
        if name.startswith("electra.embeddings."):
            gen_state[name] = disc_state[name]
    gen_state["generator_lm_head.weight"] = disc_state["electra.embeddings.word_embeddings.weight"]
    return disc_state, gen_state


@pytest.mark.parametrize("scan_layers", [True, False])
def test_hf_electra_to_ours_to_hf_round_trips_both_models_exactly(scan_layers):
    model_cfg = electra_config(scan_layers=scan_layers)
    disc_state, gen_state = hf_pair(model_cfg)
    extras = {"generator": (gen_state, hf_electra.hf_config(model_cfg, True))}
    params, report = hf_electra.hf_import(disc_state, hf_electra.hf_config(model_cfg), model_cfg, None, extras)
    assert report.kept_from_fallback == [] and report.unused == []
    exported = hf_electra.hf_export(params, model_cfg)
    disc_again, gen_again = exported.state, exported.subfolders["generator"][0]
    for original, again in ((disc_state, disc_again), (gen_state, gen_again)):
        names = set(original) - set(hf_electra.IGNORED_ON_IMPORT)
        assert names == set(again)
        for name in sorted(names):
            np.testing.assert_array_equal(again[name], original[name], err_msg=name)


def test_a_discriminator_folder_without_its_generator_imports_and_keeps_a_fresh_generator():
    model_cfg = electra_config()
    disc_state, _ = hf_pair(model_cfg)
    fallback = random_params(get_family("electra").build_model(model_cfg), random_batch(0), seed=1)
    params, report = hf_electra.hf_import(disc_state, hf_electra.hf_config(model_cfg), model_cfg, fallback, {})
    assert report.kept_from_fallback == ["generator/ (no generator folder: the whole generator)"]
    jax.tree.map(np.testing.assert_array_equal, params["generator"], fallback["generator"])
    np.testing.assert_array_equal(params["embeddings"]["word"]["embedding"],
                                  disc_state["electra.embeddings.word_embeddings.weight"])


def test_electra_import_errors_name_the_config_key():
    model_cfg = electra_config()
    disc_state, gen_state = hf_pair(model_cfg)
    hf_cfg, gen_cfg = hf_electra.hf_config(model_cfg), hf_electra.hf_config(model_cfg, True)
    with pytest.raises(ValueError, match=r"config\.model\.embedding_size=16 .* embedding_size=8"):
        hf_electra.hf_import(disc_state, {**hf_cfg, "embedding_size": 8}, model_cfg, None, {})
    with pytest.raises(ValueError, match=r"hidden_size=16, but config\.model\.generator_size_ratio=0\.25 gives"):
        hf_electra.hf_import(disc_state, hf_cfg, model_cfg, None,
                             {"generator": (gen_state, {**gen_cfg, "hidden_size": 16})})
    with pytest.raises(ValueError, match="model_type='bert'"):
        hf_electra.hf_import(disc_state, {**hf_cfg, "model_type": "bert"}, model_cfg, None, {})


def _count(tree) -> int:
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(tree)))


def hf_count(class_name: str, hf_cfg: dict) -> int:
    with torch.device("meta"):
        model = getattr(transformers, class_name)(transformers.ElectraConfig(**hf_cfg))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["electra_small", pytest.param("electra_base", marks=pytest.mark.slow),
                                  pytest.param("electra_large", marks=pytest.mark.slow)])
def test_published_shapes_count_as_hf_discriminator_and_generator(name):
    """Counted without allocating (eval_shape; HF on the meta device). The generator counts the shared embeddings."""
    import importlib

    model_cfg = importlib.import_module(f"bert_jax.configs.{name}").get_config().model
    batch = {key: np.zeros((1, 8), np.int32) for key in ("input_ids", "token_type_ids", "attention_mask",
                                                        "masked_positions", "masked_ids")}
    batch["masked_weights"] = np.zeros((1, 8), np.float32)
    model = get_family("electra").build_model(model_cfg)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), batch)["params"])
    discriminator = _count({k: v for k, v in shapes.items() if k != "generator"})
    generator = _count({k: v for k, v in shapes.items() if k != "discriminator"})
    hf_disc = hf_count("ElectraForPreTraining", hf_electra.hf_config(model_cfg))
    hf_gen = hf_count("ElectraForMaskedLM", hf_electra.hf_config(model_cfg, generator=True))
    print(f"{name}: discriminator {discriminator:,} vs ElectraForPreTraining {hf_disc:,}; "
          f"generator {generator:,} vs ElectraForMaskedLM {hf_gen:,}")
    assert (discriminator, generator) == (hf_disc, hf_gen)
