"""Causal LM on the modernbert family (config.model.objective='clm'): attention that never looks ahead and looks back
over half the encoder's window, a next-token loss that never crosses a document, unmasked batches, the export as
transformers' ModernBertDecoderForCausalLM with logits parity, and the objective switch of a biphasic run."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_model_config
from hf_parity import random_params
from numerics import TRANSFORMERS, relative_error

import bert_jax
import bert_jax.configs.tiny
import bert_jax.configs.modernbert_base as modernbert_base
from bert_jax.families import get_family
from bert_jax.kernels import attention as kernels
from bert_jax.models.attention import choose_kernel
from bert_jax.objectives.causal_lm import CAUSAL_LM, next_token_weights
from bert_jax.train import stages
from bert_jax.train.config_validation import resolve_config, validate_config
from data_pipelines.loader import pipeline

LENGTH = 32  # 4x the local window of 8: a causal local layer sees 4 tokens (itself and 3 back), HF's sliding_window


def causal_config(**overrides):
    values = dict(family="modernbert", objective="clm", num_layers=4, max_position_embeddings=LENGTH,
                  layer_norm_eps=1e-5, local_attention=8, global_attn_every_n_layers=3, global_rope_theta=160_000.0,
                  local_rope_theta=10_000.0, attention_bias=False, mlp_bias=False, norm_bias=False, decoder_bias=True,
                  classifier_bias=False, hidden_act="gelu", pad_token_id=0, dropout_rate=0.0,
                  attention_dropout_rate=0.0, attention_impl="xla", scan_layers=False)
    values.update(overrides)
    values.pop("type_vocab_size", None)
    return small_model_config(**values)


def packed_batch(lengths=(7, 13, 9), seed: int = 3) -> dict:
    """One row of three documents (segment ids 1, 2, 3, positions restarting), then padding."""
    rng = np.random.default_rng(seed)
    ids, segments, positions = (np.zeros(LENGTH, np.int32) for _ in range(3))
    start = 0
    for i, n in enumerate(lengths):
        ids[start:start + n] = rng.integers(5, 97, n)
        segments[start:start + n], positions[start:start + n] = i + 1, np.arange(n)
        start += n
    return {"input_ids": jnp.asarray(ids[None]), "attention_mask": jnp.asarray((np.arange(LENGTH) < start)[None] * 1),
            "segment_ids": jnp.asarray(segments[None]), "position_ids": jnp.asarray(positions[None])}


@pytest.fixture(scope="module")
def model_and_params():
    """The micro decoder, its random params and one jitted apply: every test's batch is one row of LENGTH."""
    model = get_family("modernbert").build_model(causal_config())
    return jax.jit(model.apply), random_params(model, packed_batch(), seed=0)


def test_causal_attention_masks_the_future_and_looks_back_over_the_decoder_window():
    segments = jnp.zeros((1, 12), jnp.int32)
    allowed = np.asarray(kernels.allowed_keys(segments, 3, causal=True))[0, 0]
    q, k = np.meshgrid(np.arange(12), np.arange(12), indexing="ij")
    np.testing.assert_array_equal(allowed, (k <= q) & (q - k <= 3))
    everything_before = np.asarray(kernels.allowed_keys(segments, None, causal=True))[0, 0]
    np.testing.assert_array_equal(everything_before, k <= q)


def test_no_position_sees_a_later_token(model_and_params):
    apply, params = model_and_params
    batch = packed_batch()
    later = dict(batch, input_ids=batch["input_ids"].at[0, 20:].set(7))
    before, after = (np.asarray(apply({"params": params}, b)["clm_logits"][0]) for b in (batch, later))
    np.testing.assert_array_equal(before[:20], after[:20])
    assert relative_error(before[20:29], after[20:29]) > 1e-3  # the changed tokens do matter where seen


def test_next_token_loss_never_crosses_a_document_boundary(model_and_params):
    apply, params = model_and_params
    batch = packed_batch()
    weights = np.asarray(next_token_weights(batch))[0]
    # Targets inside each document (6 + 12 + 8), none from a document's last token to the next one's first.
    assert weights.sum() == 26 and weights[6] == 0 and weights[19] == 0 and not weights[28:].any()
    logits = apply({"params": params}, batch)["clm_logits"]
    ratio = jax.jit(lambda logits, batch: CAUSAL_LM.metrics(CAUSAL_LM.sums({"clm_logits": logits}, batch),
                                                            CAUSAL_LM.weights(batch)))(logits, batch)
    log_probs = np.asarray(jax.nn.log_softmax(logits[0].astype(jnp.float32)))
    ids, start, total = np.asarray(batch["input_ids"][0]), 0, 0.0
    for n in (7, 13, 9):
        total -= sum(log_probs[start + t, ids[start + t + 1]] for t in range(n - 1))
        start += n
    assert float(ratio["clm_loss"]) == pytest.approx(total / 26, rel=1e-5)
    assert float(ratio["perplexity"]) == pytest.approx(np.exp(total / 26), rel=1e-5)


@pytest.mark.slow  # ~20 s on 2 cores, most of it loading transformers' model
def test_causal_export_loads_as_modernbert_decoder_with_logits_parity(tmp_path, model_and_params):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bert_jax.hf import folder as hf_folder  # noqa: PLC0415

    apply, params = model_and_params
    exported = get_family("modernbert").to_hf(params, causal_config())
    hf_folder.write_hf_folder(str(tmp_path), exported.state, exported.config, tokenizer_dir=None)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    assert type(hf_model).__name__ == "ModernBertDecoderForCausalLM"
    assert hf_model.config.sliding_window == 4 and hf_model.config.layer_types[:2] == ["full_attention",
                                                                                      "sliding_attention"]
    mask = (np.arange(LENGTH) < 27)[None].astype(np.int32)  # padding at the end: the real tokens must agree
    ids = np.random.default_rng(1).integers(5, 97, (1, LENGTH)).astype(np.int32) * mask
    batch = {"input_ids": jnp.asarray(ids), "attention_mask": jnp.asarray(mask), "segment_ids": jnp.asarray(mask),
             "position_ids": jnp.asarray(np.arange(LENGTH)[None], jnp.int32)}
    ours = np.asarray(apply({"params": params}, batch)["clm_logits"])
    with torch.no_grad():
        theirs = hf_model(input_ids=torch.tensor(ids, dtype=torch.long),
                          attention_mask=torch.tensor(mask)).logits.numpy()
    real = mask.astype(bool)
    diff = relative_error(ours[real], theirs[real])
    print(f"ModernBERT decoder: relative error of CLM logits {diff:.2e}")
    assert diff <= 1e-4 and diff <= 5 * TRANSFORMERS
    # The window is what transformers' decoder defines: the encoder's (4 either side, so 4 back) differs.
    encoder_window = get_family("modernbert").build_model(causal_config(local_attention=10))
    wider = np.asarray(jax.jit(encoder_window.apply)({"params": params}, batch)["clm_logits"])
    assert relative_error(wider[real], theirs[real]) > 100 * TRANSFORMERS


def test_an_encoder_run_still_exports_a_masked_lm(model_and_params):
    _, params = model_and_params
    exported = get_family("modernbert").to_hf(params, causal_config(objective=""))
    assert exported.config["architectures"] == ["ModernBertForMaskedLM"]
    assert any(".attn.Wqkv." in name for name in exported.state)
    decoder = get_family("modernbert").to_hf(params, causal_config())
    assert decoder.config["model_type"] == "modernbert-decoder"
    assert not any(".attn.Wqkv." in name for name in decoder.state) and "lm_head.dense.weight" in decoder.state


def test_causal_batches_are_unmasked():
    config = modernbert_base.get_config("tiny,clm")
    spec = pipeline.batch_spec(config.data, 2)
    assert not {"masked_positions", "masked_ids", "masked_weights", "maskable_tokens"} & set(spec)
    ids = np.array([[2, 9, 10, 11, 3, 1, 1], [2, 12, 13, 3, 2, 14, 3]], np.int32)
    stacked = {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "segment_ids": ids * 0,
               "position_ids": ids * 0}
    batch = pipeline.MaskBatch(None, ("segment_ids", "position_ids"), pad_id=1).random_map(
        stacked, np.random.default_rng(0))
    np.testing.assert_array_equal(batch["input_ids"], ids)  # nothing corrupted: the targets are the next tokens
    np.testing.assert_array_equal(batch["attention_mask"], ids != 1)


def test_biphasic_switches_the_objective_and_the_data_with_it():
    config = modernbert_base.get_config("tiny,biphasic")
    plan = stages.plan(config)
    assert [(s.start, s.end) for s in plan] == [(0, 100), (100, 400)]  # 25 % causal, the default split
    assert [(s.config.model.objective, s.config.data.objective) for s in plan] == [("clm", "clm"), ("mlm", "mlm")]
    assert stages.stage_at(config, 100).config.model.objective == "clm"
    assert stages.stage_at(config, 101).config.model.objective == "mlm"
    config.train.objective_switch.fraction = 0.5
    assert [s.start for s in stages.plan(config)] == [0, 200]
    validate_config(resolve_config(config))
    config.model.objective, config.train.objective_switch.to = "", "clm"  # the other way: MLM, then CLM
    assert [s.config.data.objective for s in stages.plan(config)] == ["", "clm"]
    validate_config(resolve_config(config))


@pytest.mark.parametrize("changes, message", [
    (dict(family="bert"), r"config.model.objective='clm': family 'bert' trains ''"),
    (dict(attention_impl="cudnn"), r"attention_impl='cudnn' does not apply causal"),
    (dict(data_objective=""), r"config.data.objective='' differs from config.model.objective='clm'"),
])
def test_a_causal_config_a_family_or_kernel_cannot_run_is_refused_naming_the_key(changes, message):
    config = modernbert_base.get_config("tiny,clm")
    with config.unlocked():
        if "family" in changes:
            config = bert_jax.configs.tiny.get_config()
            config.model.objective = "clm"
        if "attention_impl" in changes:
            config.model.attention_impl = "cudnn"
        if "data_objective" in changes:
            config = config.copy_and_resolve_references()
            config.data.objective = ""
    with pytest.raises(ValueError, match=message):
        validate_config(resolve_config(config))


def test_auto_picks_a_kernel_that_applies_causal_attention():
    cfg = {"attention_impl": "auto", "dtype": "bfloat16", "hidden_size": 64, "num_heads": 2}
    assert choose_kernel(cfg, platform="gpu", window=True, causal=True).impl == "triton"
    assert choose_kernel(cfg, platform="gpu", window=False, causal=True).impl == "xla"  # rows that may be packed
    assert choose_kernel(cfg, platform="gpu", window=False, causal=True, packed=False).impl == "cudnn"
    choose_kernel(dict(cfg, attention_impl="cudnn"), platform="gpu", window=True, causal=True, packed=False)
    assert choose_kernel(cfg, platform="tpu", window=True, causal=True).impl == "splash"
    with pytest.raises(ValueError, match="attention_impl='cudnn' does not apply causal attention.*'xla'"):
        choose_kernel(dict(cfg, attention_impl="cudnn"), platform="gpu", causal=True)


@pytest.mark.slow  # splash interpreted: ~10 s on 2 cores
@pytest.mark.parametrize("window", [None, 5])
def test_splash_applies_the_causal_mask_as_xla_does(window):
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 128, 2, 16)), jnp.float32) for _ in range(3))
    segments = jnp.asarray(np.repeat([[0] * 50 + [1] * 60 + [-1] * 18], 2, axis=0), jnp.int32)
    reference = kernels.xla_attention(q, k, v, segments, window, causal=True)
    splash = kernels.splash_attention(q, k, v, segments, window, interpret=True, causal=True)
    real = np.asarray(segments) >= 0
    np.testing.assert_allclose(np.asarray(splash)[real], np.asarray(reference)[real], rtol=2e-5, atol=2e-5)


def test_a_decoder_folder_imports_into_either_objective_exactly(model_and_params):
    """Ettin's cross-objective training: a ModernBertDecoderForCausalLM's tensors (and config.json) import as the
    modernbert family's params, for a causal run or a masked one alike (the same parameters)."""
    from bert_jax.families import family_of_hf_config  # noqa: PLC0415

    _, params = model_and_params
    family = get_family("modernbert")
    exported = family.to_hf(params, causal_config())
    assert family_of_hf_config(exported.config, "a decoder folder") is family
    for objective in ("clm", "mlm"):
        imported, report = family.hf.from_hf(exported.state, exported.config, causal_config(objective=objective),
                                             params)
        assert not report.kept_from_fallback and not report.unused
        jax.tree.map(np.testing.assert_array_equal, imported, params)


@pytest.mark.parametrize("window", [None, 5])
def test_cudnn_call_applies_the_causal_mask_as_xla_does(window):
    """kernels.cudnn_attention's causal call (jax's dot_product_attention with is_causal and a left window) run by
    jax's xla implementation, as no GPU is here: the masks it asks cuDNN for are xla_attention's (padded rows)."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 32, 2, 8)), jnp.float32) for _ in range(3))
    segments = jnp.asarray([[1] * 32, [1] * 25 + [-1] * 7], jnp.int32)
    reference = kernels.xla_attention(q, k, v, segments, window, causal=True)
    ours = kernels.cudnn_attention(q, k, v, segments, window, packed=False, causal=True, implementation="xla")
    real = np.asarray(segments) >= 0
    np.testing.assert_allclose(np.asarray(ours)[real], np.asarray(reference)[real], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="packed rows"):
        kernels.cudnn_attention(q, k, v, segments, window, packed=True, causal=True)
