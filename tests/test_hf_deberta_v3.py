"""Hugging Face interop for DeBERTa-v3: log-bucketed relative positions equal transformers', MLM logits and
hidden states match DebertaV2ForMaskedLM / DebertaV2Model with padding and sequences longer than the
buckets, a packed document sees what it sees alone, exact HF -> ours -> HF round trips, and bad input
failing by name.

Skipped cleanly without torch / transformers (pip install -e ".[test]" brings both).
"""
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_batch, small_model_config
from hf_parity import gathered, random_params
from numerics import TRANSFORMERS, relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.models.deberta_v2 import modeling_deberta_v2 as hf_deberta  # noqa: E402

from bert_jax.hf import deberta_v3 as hf_deberta_v3, folder as hf_folder  # noqa: E402
from bert_jax.families import get_family  # noqa: E402
from bert_jax.models.deberta_v3 import build_deberta_v3_mlm  # noqa: E402
from bert_jax.models.disentangled_attention import relative_embedding_index  # noqa: E402

# 48 tokens over 8 buckets (exact distances up to 4, log-spaced up to 16, clamped beyond): every
# branch of the bucketing runs.
LENGTH, BUCKETS, MAX_RELATIVE = 48, 8, 16


def deberta_config(**overrides):
    values = dict(family="deberta_v3", type_vocab_size=0, layer_norm_eps=1e-7, position_buckets=BUCKETS,
                  max_relative_positions=MAX_RELATIVE, pad_token_id=0, attention_dropout_rate=0.0)
    values.update(overrides)
    return small_model_config(**values)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Random params (scanned) of the small DebertaV2ForMaskedLM, and the folder they export to."""
    model_cfg = deberta_config()
    model = build_deberta_v3_mlm(model_cfg)
    params = random_params(model, random_batch(0, length=LENGTH), seed=0)
    out = str(tmp_path_factory.mktemp("deberta_hf"))
    hf_folder.write_hf_folder(out, hf_deberta_v3.params_to_hf(params, model_cfg), hf_deberta_v3.hf_config(model_cfg),
                              tokenizer_dir=None)
    return model_cfg, model, params, out


def torch_inputs(batch):
    return dict(input_ids=torch.tensor(np.asarray(batch["input_ids"])),
                attention_mask=torch.tensor(np.asarray(batch["attention_mask"])))


@pytest.mark.parametrize("length, buckets, max_relative", [(LENGTH, BUCKETS, MAX_RELATIVE), (512, 256, 512)])
def test_relative_embedding_rows_equal_transformers_log_buckets(length, buckets, max_relative):
    positions = torch.zeros(1, length, 1)
    relative = hf_deberta.build_relative_position(positions, positions, bucket_size=buckets,
                                                  max_position=max_relative)
    theirs = torch.clamp(relative[0] + buckets, 0, 2 * buckets - 1).numpy()
    np.testing.assert_array_equal(relative_embedding_index(length, buckets, max_relative), theirs)


def test_deberta_in_transformers_matches_our_mlm_logits_and_hidden_states_with_padding(exported):
    model_cfg, model, params, out = exported
    batch = random_batch(1, length=LENGTH)
    ours = np.asarray(model.apply({"params": params}, batch)["mlm_logits"])
    hidden = np.asarray(model.apply({"params": params}, batch, method=lambda m, b: m.encoder(
        b["input_ids"], b["attention_mask"])))
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    bare = transformers.AutoModel.from_pretrained(out).eval()
    assert (type(mlm).__name__, type(bare).__name__) == ("DebertaV2ForMaskedLM", "DebertaV2Model")
    with torch.no_grad():
        logits = mlm(**torch_inputs(batch)).logits.numpy()
        their_hidden = bare(**torch_inputs(batch)).last_hidden_state.numpy()
    real = np.asarray(batch["attention_mask"]).astype(bool)
    logits_error = relative_error(ours, gathered(logits, batch["masked_positions"]))
    hidden_error = relative_error(hidden[real], their_hidden[real])
    print(f"DeBERTa-v3 seq {LENGTH}, {BUCKETS} buckets: relative error of MLM logits {logits_error:.2e}, "
          f"of hidden states {hidden_error:.2e}")
    assert logits_error <= TRANSFORMERS and hidden_error <= TRANSFORMERS


def test_a_packed_document_gets_the_hidden_states_transformers_gives_it_alone(exported):
    """Positions are relative only: a document packed second in a row sees what it sees alone. (Rows of
    the parity test's shape, so the eager ops compiled there are reused.)"""
    _, model, params, out = exported
    rng = np.random.default_rng(3)
    first = 20
    ids = rng.integers(5, 97, (4, LENGTH)).astype(np.int32)
    segments = np.broadcast_to((np.arange(LENGTH) >= first).astype(np.int32), ids.shape)
    hidden = np.asarray(model.apply({"params": params}, {}, method=lambda m, _: m.encoder(
        jnp.asarray(ids), jnp.ones_like(ids), None, jnp.asarray(segments))))
    bare = transformers.AutoModel.from_pretrained(out).eval()
    with torch.no_grad():
        alone = bare(input_ids=torch.tensor(ids[:, first:])).last_hidden_state.numpy()
    assert relative_error(hidden[:, first:], alone) <= TRANSFORMERS


def test_hf_deberta_to_ours_to_hf_round_trips_every_tensor_exactly():
    model_cfg = deberta_config()
    torch.manual_seed(0)
    hf_model = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**hf_deberta_v3.hf_config(model_cfg)))
    original = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    params, report = hf_deberta_v3.hf_to_params(original, model_cfg)
    assert report.kept_from_fallback == [] and report.unused == []
    again = hf_deberta_v3.params_to_hf(params, model_cfg)
    assert set(again) == set(original) - set(hf_deberta_v3.IGNORED_ON_IMPORT)
    for name in sorted(again):
        np.testing.assert_array_equal(again[name], original[name], err_msg=name)


def test_a_deberta_v2_model_checkpoint_imports_its_encoder_and_keeps_the_head_from_the_fallback():
    model_cfg = deberta_config()
    torch.manual_seed(0)
    bare = transformers.DebertaV2Model(transformers.DebertaV2Config(**hf_deberta_v3.hf_config(model_cfg)))
    state = {k: v.numpy() for k, v in bare.state_dict().items()}
    rng = np.random.default_rng(0)
    full = {s.hf_name: rng.standard_normal(s.hf_shape).astype(np.float32)
            for s in hf_deberta_v3.tensor_specs(model_cfg)}
    fallback, _ = hf_deberta_v3.hf_to_params(full, model_cfg)
    params, report = hf_deberta_v3.hf_to_params(state, model_cfg, fallback)
    assert sorted(report.kept_from_fallback) == sorted(
        s.hf_name for s in hf_deberta_v3.tensor_specs(model_cfg) if s.hf_name.startswith("cls."))
    assert report.unused == []
    np.testing.assert_array_equal(params["encoder"]["rel_embeddings"]["embedding"],
                                  state["encoder.rel_embeddings.weight"])


def test_bad_relative_position_settings_and_kernels_fail_naming_the_key():
    build = get_family("deberta_v3").build_model  # the family's config checks are the encoder's
    with pytest.raises(ValueError, match=r"config\.model\.position_buckets=32 must be in \(0, config\.model\."
                                         r"max_relative_positions=16\]"):
        build(deberta_config(position_buckets=32))
    with pytest.raises(ValueError, match=r"config\.model\.attention_impl='cudnn'.*which cuDNN cannot"):
        build(deberta_config(attention_impl="cudnn"))
    hf_cfg = hf_deberta_v3.hf_config(deberta_config())
    with pytest.raises(ValueError, match=r"config\.json position_biased_input=True"):
        hf_deberta_v3.model_config_from_hf({**hf_cfg, "position_biased_input": True})
    with pytest.raises(ValueError, match=r"config\.model\.position_buckets=8 but .* position_buckets=256"):
        hf_deberta_v3.hf_import({}, {**hf_cfg, "position_buckets": 256}, deberta_config(), None)


def test_an_exported_unigram_tokenizer_loads_as_deberta_v2_tokenizer_with_the_same_ids(exported, tmp_path):
    from data_pipelines.tokenizers.kinds import get_kind
    from test_data_tokenizer import SENTENCE, sample_lines

    model_cfg, _, params, _ = exported
    tokenizer = get_kind("unigram").train(sample_lines()[:400], 300)
    tokenizer.save(str(tmp_path / "tokenizer"))
    hf_folder.write_hf_folder(str(tmp_path / "hf"), hf_deberta_v3.params_to_hf(params, model_cfg),
                              hf_deberta_v3.hf_config(model_cfg), str(tmp_path / "tokenizer"))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert type(hf).__name__ == "DebertaV2Tokenizer"
    (ids,) = tokenizer.encode_ids([SENTENCE])
    assert hf(SENTENCE, add_special_tokens=False)["input_ids"] == ids.tolist()
    assert (hf.pad_token_id, hf.unk_token_id, hf.cls_token_id, hf.sep_token_id, hf.mask_token_id) == (0, 1, 2, 3, 4)
