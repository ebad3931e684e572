"""SpanBERT's span boundary objective: the boundary inputs the masker gives, the head and loss against the paper's
equations in numpy, and the export as a BertForMaskedLM (logits parity; the head left out). Micro shapes, seconds.

The lockstep training test covers the SBO against a torch reference too (tests/test_training_parity.py, slow).
"""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import random_batch, small_model_config
from hf_parity import gathered, random_params
from numerics import REORDERED, TRANSFORMERS, relative_error
from scipy.special import erf

from bert_jax.families import get_family
from bert_jax.models.spanbert import SBO_HEAD, validate_config
from bert_jax.objectives.span_boundary import span_boundary_objective
from data_pipelines.loader import masking
from data_pipelines.loader.span_boundaries import SPAN_BOUNDARY_KEYS, span_boundaries
from data_pipelines.tokenizers.tokenizer import SpecialIds

SPECIALS = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 97
MAX_SPAN_TOKENS = 4


def test_boundaries_of_known_masks():
    """Runs [1], [3, 4] and [5] touching (one span 3..5), [7..8]; a run at the row's edge gets -1 / L."""
    selected = np.zeros((2, 10), bool)
    selected[0, [1, 3, 4, 5, 7, 8]] = True
    selected[1, [0, 1, 9]] = True
    left, right, offset = span_boundaries(selected)
    expected = {(0, 1): (0, 2, 0), (0, 3): (2, 6, 0), (0, 4): (2, 6, 1), (0, 5): (2, 6, 2), (0, 7): (6, 9, 0),
                (0, 8): (6, 9, 1), (1, 0): (-1, 2, 0), (1, 1): (-1, 2, 1), (1, 9): (8, 10, 0)}
    for (row, col), want in expected.items():
        assert (left[row, col], right[row, col], offset[row, col]) == want, (row, col)
    assert not left[~selected].any() and not right[~selected].any() and not offset[~selected].any()


def _span_masker(span_boundaries_on: bool) -> masking.Masker:
    spec = masking.MaskingSpec("span", 0.15, 40, 8192, span_boundaries=span_boundaries_on)
    return masking.Masker(spec, SPECIALS, word_starts=np.ones(8192, bool))


def test_span_masking_gives_each_prediction_its_boundaries_with_pinned_statistics():
    """Every prediction's boundaries are the unmasked tokens around its run of masked tokens; adding them draws
    nothing (the masks are those of a run without them); the spans' statistics are pinned for this seed."""
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 8192, (64, 128)).astype(np.int32)
    ids[:, 0], ids[:, -1] = SPECIALS.cls, SPECIALS.sep
    out = _span_masker(True)(ids, np.random.default_rng(1))
    plain = _span_masker(False)(ids, np.random.default_rng(1))
    assert set(out) - set(plain) == set(SPAN_BOUNDARY_KEYS)
    for key in plain:
        np.testing.assert_array_equal(out[key], plain[key])
    w = out["masked_weights"] > 0
    pos, left, right, offset = (out[k] for k in ("masked_positions", *SPAN_BOUNDARY_KEYS))
    selected = np.zeros(ids.shape, bool)
    rows = np.nonzero(w)[0]
    selected[rows, pos[w]] = True
    assert not selected[rows, left[w]].any() and not selected[rows, right[w]].any()  # boundaries are unmasked
    assert (left[w] < pos[w]).all() and (pos[w] < right[w]).all() and (offset[w] == pos[w] - left[w] - 1).all()
    for r, lo, hi in zip(rows, left[w], right[w]):
        assert selected[r, lo + 1:hi].all()  # the whole run between them is masked
    assert not (left[~w].any() or right[~w].any() or offset[~w].any())  # padding predictions hold 0
    span_tokens = (right - left - 1)[w & (offset == 0)]
    # Theory: drawn spans average 3.80 words (p = 0.2, at most 10, every token a word); merged runs are longer
    # where two drawn spans touch. Pinned for this batch and seed:
    assert (len(span_tokens), round(float(span_tokens.mean()), 3), int(span_tokens.max())) == (291, 4.144, 17)
    assert w.sum() == span_tokens.sum() == 1206
    assert int(np.sum(offset[w] >= 15)) == 2  # SpanBERT's 15-token cut leaves out 2 of 1206 predictions


def _micro():
    model_cfg = small_model_config(family="spanbert", vocab_size=VOCAB, sbo_max_span_tokens=MAX_SPAN_TOKENS,
                                   sbo_position_size=8, dropout_rate=0.0, attention_dropout_rate=0.0,
                                   scan_layers=False)
    batch = random_batch(0, vocab=VOCAB)
    selected = np.zeros(batch["input_ids"].shape, bool)
    rows = np.arange(len(selected))[:, None]
    selected[rows, np.asarray(batch["masked_positions"])] = True
    per_token = span_boundaries(selected)
    for key, values in zip(SPAN_BOUNDARY_KEYS, per_token):
        batch[key] = jnp.asarray(np.take_along_axis(values, np.asarray(batch["masked_positions"]), axis=1))
    batch["masked_weights"] = batch["masked_weights"].at[0, 0].set(0.0)  # a padding prediction
    model = get_family("spanbert").build_model(model_cfg)
    params = random_params(model, batch)
    return model_cfg, model, batch, params, jax.jit(model.apply)({"params": params}, batch)


@pytest.fixture(scope="module")
def micro():
    return _micro()


def _layer_norm(x, p, eps=1e-12):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["norm"]["scale"] + p["norm"]["bias"]


def _gelu(x):
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))  # the exact GELU


def test_sbo_loss_equals_the_papers_equations_in_numpy(micro):
    """h0 = [x_{s-1}; x_{e+1}; p_{i-s+1}], h1 = LN(GeLU(W1 h0)), y = LN(GeLU(W2 h1)), logits = y E^T + b; the loss the
    mean cross-entropy over the predictions with both boundaries in the row and the offset in the table."""
    model_cfg, model, batch, params, outputs = micro
    objective = span_boundary_objective(MAX_SPAN_TOKENS, loss_weight=1.0)
    sums, weights = objective.sums(outputs, batch), objective.weights(batch)
    hidden = np.asarray(outputs["last_hidden_state"], np.float64)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params[SBO_HEAD])
    word = np.asarray(params["encoder"]["embeddings"]["word"]["embedding"], np.float64)
    b = {k: np.asarray(v) for k, v in batch.items()}
    length = hidden.shape[1]
    losses, counted = [], 0
    for r, i in zip(*np.nonzero(b["masked_weights"])):
        left, right, offset = b["masked_span_left"][r, i], b["masked_span_right"][r, i], b["masked_span_offset"][r, i]
        if left < 0 or right >= length or offset >= MAX_SPAN_TOKENS:
            continue
        h0 = np.concatenate([hidden[r, left], hidden[r, right], p["position"]["embedding"][offset]])
        h1 = _layer_norm(_gelu(h0 @ p["dense_1"]["kernel"] + p["dense_1"]["bias"]), p["norm_1"])
        y = _layer_norm(_gelu(h1 @ p["dense_2"]["kernel"] + p["dense_2"]["bias"]), p["norm_2"])
        logits = y @ word.T + p["output_bias"]
        logits -= logits.max()
        losses.append(np.log(np.exp(logits).sum()) - logits[b["masked_ids"][r, i]])
        counted += 1
    assert 0 < counted < b["masked_weights"].sum()  # some predictions fall outside (edge spans, long offsets)
    assert float(weights["sbo_loss"]) == counted
    np.testing.assert_allclose(float(sums["sbo_loss"] / weights["sbo_loss"]), np.mean(losses), rtol=REORDERED)
    metrics = objective.metrics(sums, weights)
    np.testing.assert_allclose(float(metrics["loss"]), float(metrics["mlm_loss"] + metrics["sbo_loss"]), rtol=1e-6)
    unweighted = span_boundary_objective(MAX_SPAN_TOKENS, loss_weight=0.0).metrics(sums, weights)
    assert float(unweighted["loss"]) == pytest.approx(float(metrics["mlm_loss"]), rel=1e-6)


def test_export_is_a_bert_for_masked_lm_without_the_sbo_head_and_its_logits_match(micro, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bert_jax.hf import folder as hf_folder

    model_cfg, model, batch, params, outputs = micro
    family = get_family("spanbert")
    exported = family.to_hf(params, model_cfg)
    assert exported.config["architectures"] == ["BertForMaskedLM"]
    hf_folder.write_hf_folder(str(tmp_path), exported.state, exported.config, tokenizer_dir=None)
    hf_model = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path)).eval()
    assert type(hf_model).__name__ == "BertForMaskedLM"
    assert set(exported.state) == set(hf_model.state_dict())  # every tensor it holds, and nothing else (no SBO)
    ours = np.asarray(outputs["mlm_logits"])
    with torch.no_grad():
        logits = hf_model(**{k: torch.tensor(np.asarray(batch[k])) for k in
                             ("input_ids", "attention_mask", "token_type_ids")}).logits.numpy()
    diff = relative_error(ours, gathered(logits, batch["masked_positions"]))
    print(f"SpanBERT export: relative error of MLM logits {diff:.2e}")
    assert diff <= TRANSFORMERS
    # Imported back, the encoder and MLM head are the exported ones and the SBO head the fallback's, reported.
    fallback = jax.tree.map(np.zeros_like, params)
    again, report = family.hf.from_hf(exported.state, exported.config, model_cfg, fallback)
    assert report.kept_from_fallback and all(k.startswith(f"{SBO_HEAD}/") for k in report.kept_from_fallback)
    assert not np.any(again[SBO_HEAD]["dense_1"]["kernel"])
    np.testing.assert_array_equal(again["mlm_output_bias"], params["mlm_output_bias"])


def test_spanbert_without_span_boundaries_in_the_batches_fails_naming_the_key():
    config = ml_collections.ConfigDict({"model": {"family": "spanbert"}, "data": {"span_boundaries": False}})
    with pytest.raises(ValueError, match=r"set config.data.span_boundaries=True"):
        validate_config(config)
