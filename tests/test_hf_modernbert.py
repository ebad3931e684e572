"""Hugging Face interop for ModernBERT: MLM logits parity with transformers' ModernBertForMaskedLM (padding, a
sequence longer than the local window, scan on and off), packed rows equal to each document alone, exact
HF -> ours -> HF round trips, and the errors that name the culprit.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_batch, small_model_config
from hf_parity import gathered, random_params
from numerics import TRANSFORMERS, relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.hf import folder as hf_folder, modernbert as hf_modernbert  # noqa: E402
from bert_jax.families import get_family  # noqa: E402

LENGTH = 32  # 4x the local window of 8 (4 tokens either side): local layers really mask
PACKED = 1e-5  # packed rows vs each document alone, fp32 (the bound)


def modernbert_config(**overrides):
    values = dict(family="modernbert", num_layers=4, max_position_embeddings=LENGTH, layer_norm_eps=1e-5,
                  local_attention=8, global_attn_every_n_layers=3, global_rope_theta=160_000.0,
                  local_rope_theta=10_000.0, attention_bias=False, mlp_bias=False, norm_bias=False,
                  decoder_bias=True, classifier_bias=False, hidden_act="gelu", pad_token_id=0, dropout_rate=0.0,
                  attention_dropout_rate=0.0, attention_impl="xla")
    values.update(overrides)
    values.pop("type_vocab_size", None)
    return small_model_config(**values)


def batch_of(length: int = LENGTH, seed: int = 1) -> dict:
    return random_batch(seed, length=length, predictions=8)


@pytest.fixture(scope="module")
def params():
    """One draw of random params (scanned layout) and the same unrolled."""
    from bert_jax.models.scan_layout import unstack_layers

    model = get_family("modernbert").build_model(modernbert_config())
    scanned = random_params(model, batch_of(), seed=0)
    return {True: scanned, False: unstack_layers(scanned)}


def hf_model_from(tmp_path, params, model_cfg, attn_implementation="eager"):
    exported = get_family("modernbert").to_hf(params, model_cfg)
    state, hf_cfg = exported.state, exported.config
    hf_folder.write_hf_folder(str(tmp_path), state, hf_cfg, tokenizer_dir=None)
    return transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path),
                                                             attn_implementation=attn_implementation).eval()


@pytest.mark.parametrize("scan_layers,parametrization", [
    # unrolled (and its check that the window is applied): slow, ~8 s on 2 cores; the scanned layout stays default
    (True, "standard"), pytest.param(False, "standard", marks=pytest.mark.slow),
    pytest.param(True, "mup", marks=pytest.mark.slow)])
def test_modernbert_in_transformers_matches_our_mlm_logits_with_padding_past_the_window(tmp_path, params,
                                                                                        scan_layers, parametrization):
    # μP at 4x its base width: the export folds the logits' multiplier into the query slice of the fused Wqkv.
    model_cfg = modernbert_config(scan_layers=scan_layers, parametrization=parametrization, mup_base_width=8)
    model = get_family("modernbert").build_model(model_cfg)
    batch = batch_of()
    # Compiled whole, the scanned model runs sooner than op by op; the unrolled one the other way round.
    apply = jax.jit(model.apply) if scan_layers else model.apply
    ours = np.asarray(apply({"params": params[scan_layers]}, batch)["mlm_logits"])
    hf_model = hf_model_from(tmp_path, params[scan_layers], model_cfg)
    assert type(hf_model).__name__ == "ModernBertForMaskedLM"
    assert hf_model.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention",
                                           "full_attention"]
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor(np.asarray(batch["input_ids"])),
                          attention_mask=torch.tensor(np.asarray(batch["attention_mask"]))).logits.numpy()
    theirs = gathered(logits, batch["masked_positions"])
    diff = relative_error(ours, theirs)
    print(f"ModernBERT scan_layers={scan_layers}: relative error of MLM logits {diff:.2e}")
    assert diff <= TRANSFORMERS

    if parametrization == "mup":  # the fold is what makes them equal: unfolded, transformers computes other logits
        unfolded = hf_model_from(tmp_path / "unfolded", params[scan_layers], modernbert_config(scan_layers=scan_layers))
        with torch.no_grad():
            plain = unfolded(input_ids=torch.tensor(np.asarray(batch["input_ids"])),
                             attention_mask=torch.tensor(np.asarray(batch["attention_mask"]))).logits.numpy()
        assert relative_error(ours, gathered(plain, batch["masked_positions"])) > 100 * TRANSFORMERS
    if not scan_layers:  # once is enough (unrolled: no scan to compile again)
        # The local window is applied: the same weights with every layer global give other logits.
        wide = get_family("modernbert").build_model(modernbert_config(scan_layers=False, global_attn_every_n_layers=1))
        unmasked = np.asarray(wide.apply({"params": params[False]}, batch)["mlm_logits"])
        assert relative_error(unmasked, theirs) > 100 * TRANSFORMERS


def test_packed_rows_give_each_document_its_logits_alone(params):
    """Unpadding is right: documents packed in a row (segment_ids, positions restarting) see only themselves."""
    apply = jax.jit(get_family("modernbert").build_model(modernbert_config()).apply)  # one compile, four rows
    rng = np.random.default_rng(3)
    lengths = (7, 13, 9)  # 29 real tokens, then 3 of padding: a window of 4 spans document borders
    docs = [rng.integers(5, 97, n).astype(np.int32) for n in lengths]
    row = np.zeros(LENGTH, np.int32)
    segments, positions = np.zeros(LENGTH, np.int32), np.zeros(LENGTH, np.int32)
    start = 0
    for i, doc in enumerate(docs):
        row[start:start + len(doc)] = doc
        segments[start:start + len(doc)] = i + 1
        positions[start:start + len(doc)] = np.arange(len(doc))
        start += len(doc)
    every = np.arange(LENGTH)[None]
    packed = apply({"params": params[True]}, {
        "input_ids": jnp.asarray(row[None]), "attention_mask": jnp.asarray((np.arange(LENGTH) < start)[None] * 1),
        "segment_ids": jnp.asarray(segments[None]), "position_ids": jnp.asarray(positions[None]),
        "masked_positions": jnp.asarray(every)})["mlm_logits"][0]
    start = 0
    for doc in docs:
        alone = np.zeros(LENGTH, np.int32)
        alone[:len(doc)] = doc
        logits = apply({"params": params[True]}, {
            "input_ids": jnp.asarray(alone[None]), "segment_ids": jnp.asarray((alone[None] > 0) * 1),
            "position_ids": jnp.asarray(every),
            "attention_mask": jnp.asarray((np.arange(LENGTH) < len(doc))[None] * 1),
            "masked_positions": jnp.asarray(every)})["mlm_logits"][0]
        diff = relative_error(np.asarray(packed[start:start + len(doc)]), np.asarray(logits[:len(doc)]))
        print(f"document of {len(doc)} tokens: packed vs alone relative error {diff:.2e}")
        assert diff <= PACKED
        start += len(doc)


@pytest.mark.parametrize("scan_layers", [True, False])
def test_hf_modernbert_to_ours_to_hf_round_trips_every_tensor_exactly(scan_layers):
    model_cfg = modernbert_config(scan_layers=scan_layers, attention_bias=True, mlp_bias=True, norm_bias=True,
                                  classifier_bias=True)
    torch.manual_seed(0)
    hf_cfg = transformers.ModernBertConfig(**hf_modernbert.hf_config(model_cfg))
    hf_model = transformers.ModernBertForMaskedLM(hf_cfg)
    original = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    params, report = hf_modernbert.hf_to_params(original, model_cfg)
    assert report.kept_from_fallback == [] and report.unused == []
    again = hf_modernbert.params_to_hf(params, model_cfg)
    assert set(original) == set(again)
    for name in sorted(original):
        np.testing.assert_array_equal(again[name], original[name], err_msg=name)
    # transformers' own config reads back as the config.model we started from
    values = hf_modernbert.model_config_from_hf(hf_cfg.to_dict())
    hf_modernbert.hf_bert.check_values_match(values, model_cfg, hf_modernbert.CONFIG_KEYS)


def full_state(model_cfg):
    rng = np.random.default_rng(0)
    return {s.hf_name: rng.standard_normal(s.hf_shape).astype(np.float32)
            for s in hf_modernbert.tensor_specs(model_cfg)}


def test_an_hf_folder_of_another_model_type_is_refused_naming_it():
    bert_cfg = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64).to_dict()
    with pytest.raises(ValueError, match=r"model_type='bert'.*'modernbert'"):
        get_family("modernbert").hf.from_hf({}, bert_cfg, modernbert_config(), None)


def test_an_hf_config_that_disagrees_names_the_key():
    model_cfg = modernbert_config()
    two_layers = modernbert_config(num_layers=2)  # [global, local]: every n >= 2 gives these layer_types
    assert hf_modernbert.model_config_from_hf(hf_modernbert.hf_config(two_layers))["global_attn_every_n_layers"] == 2
    get_family("modernbert").hf.from_hf(full_state(two_layers), hf_modernbert.hf_config(two_layers), two_layers, None)
    hf_cfg = hf_modernbert.hf_config(modernbert_config(local_attention=16))
    with pytest.raises(ValueError, match=r"config\.model\.local_attention=8 .* local_attention=16"):
        get_family("modernbert").hf.from_hf({}, hf_cfg, model_cfg, None)


def test_modernbert_bpe_tokenizer_exports_to_auto_tokenizer_with_the_same_ids(tmp_path):
    """The configs' tokenizer: the project's byte-level BPE with ModernBERT's specials [CLS] [SEP] [MASK] [PAD] [UNK]."""
    import bert_jax.configs.modernbert_base
    from data_pipelines.tokenizers import tokenizer as tokenizer_lib
    from data_pipelines.tokenizers import byte_bpe
    from test_data_tokenizer import SENTENCE, sample_lines

    tok_cfg = bert_jax.configs.modernbert_base.get_config("tiny").data.tokenizer
    specials = tokenizer_lib.parse_specials(tok_cfg.kind, tok_cfg.special_tokens)
    tokenizer = byte_bpe.train_byte_bpe(sample_lines()[:300], 400, specials=specials)
    tokenizer.save(str(tmp_path / "tok"))
    model_cfg = modernbert_config(vocab_size=tokenizer.get_vocab_size(), pad_token_id=1)
    params = random_params(get_family("modernbert").build_model(model_cfg), batch_of())
    exported = get_family("modernbert").hf.to_hf(params, model_cfg)
    state, hf_cfg = exported.state, exported.config
    hf_folder.write_hf_folder(str(tmp_path / "hf"), state, hf_cfg, str(tmp_path / "tok"))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    ids = tokenizer_lib.special_ids(tokenizer)
    assert (hf.cls_token, hf.sep_token, hf.mask_token, hf.pad_token, hf.unk_token) == (
        "[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]")
    assert (hf.cls_token_id, hf.sep_token_id, hf.mask_token_id, hf.pad_token_id, hf.unk_token_id) == (
        ids.cls, ids.sep, ids.mask, ids.pad, ids.unk)
    assert hf.pad_token_id == model_cfg.pad_token_id
    (ours,) = tokenizer.encode_ids([SENTENCE])
    assert hf(SENTENCE)["input_ids"] == [ids.cls, *ours.tolist(), ids.sep]


def test_a_missing_hf_tensor_is_named():
    model_cfg = modernbert_config()
    state = full_state(model_cfg)
    del state["model.layers.1.attn.Wqkv.weight"]
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*model\.layers\.1\.attn\.Wqkv\.weight"):
        hf_modernbert.hf_to_params(state, model_cfg)
    # A ModernBertModel checkpoint (no `model.` prefix, no head) imports with the head kept from a fallback.
    bare = {name[len("model."):]: array for name, array in full_state(model_cfg).items() if name.startswith("model.")}
    fallback = hf_modernbert.hf_to_params(full_state(model_cfg), model_cfg)[0]
    _, report = hf_modernbert.hf_to_params(bare, model_cfg, fallback)
    assert sorted(report.kept_from_fallback) == ["decoder.bias", "head.dense.weight", "head.norm.weight"]
