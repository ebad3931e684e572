"""Hugging Face interop for RoBERTa: MLM logits parity with transformers (padding, packed positions, scan on
and off), exact HF -> ours -> HF round trips, and import errors naming the culprit.

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

from bert_jax.hf import folder as hf_folder, roberta as hf_roberta  # noqa: E402
from bert_jax.families import get_family  # noqa: E402
from bert_jax.models.roberta import roberta_position_ids  # noqa: E402

PAD = 1


def roberta_config(**overrides):
    values = dict(family="roberta", type_vocab_size=1, max_position_embeddings=16 + PAD + 1, layer_norm_eps=1e-5,
                  pad_token_id=PAD)
    values.update(overrides)
    return small_model_config(**values)


def roberta_batch(seed: int) -> dict:
    """random_batch with RoBERTa's <pad> id where attention_mask is 0 (HF finds padding by id)."""
    batch = random_batch(seed)
    batch["input_ids"] = jnp.where(batch["attention_mask"] > 0, batch["input_ids"], PAD)
    return batch


def perturbed_params(model_cfg, seed: int = 0):
    model = get_family("roberta").build_model(model_cfg)
    return model, random_params(model, roberta_batch(0), seed)


def exported_model(tmp_path, params, model_cfg):
    exported = get_family("roberta").hf.to_hf(params, model_cfg)
    state, hf_cfg = exported.state, exported.config
    hf_folder.write_hf_folder(str(tmp_path), state, hf_cfg, tokenizer_dir=None)
    return transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path)).eval()


def test_position_ids_follow_hf_create_position_ids_from_input_ids():
    batch = roberta_batch(0)
    ours = roberta_position_ids(batch["attention_mask"], None, PAD)
    ids = torch.tensor(np.asarray(batch["input_ids"]))
    mask = ids.ne(PAD).int()
    theirs = torch.cumsum(mask, dim=1) * mask + PAD  # transformers' create_position_ids_from_input_ids
    np.testing.assert_array_equal(np.asarray(ours), theirs.numpy())


@pytest.mark.parametrize("scan_layers", [True, False])
def test_roberta_in_transformers_matches_our_mlm_logits_with_padding(tmp_path, scan_layers):
    model_cfg = roberta_config(scan_layers=scan_layers)
    model, params = perturbed_params(model_cfg)
    batch = roberta_batch(1)
    ours = np.asarray(model.apply({"params": params}, batch)["mlm_logits"])
    hf_model = exported_model(tmp_path, params, model_cfg)
    assert type(hf_model).__name__ == "RobertaForMaskedLM"
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor(np.asarray(batch["input_ids"])),
                          attention_mask=torch.tensor(np.asarray(batch["attention_mask"]))).logits.numpy()
    theirs = gathered(logits, batch["masked_positions"])
    diff = relative_error(ours, theirs)
    print(f"RoBERTa scan_layers={scan_layers}: relative error of MLM logits {diff:.2e}")
    assert diff <= TRANSFORMERS


def test_packed_position_ids_are_offset_like_hf_positions(tmp_path):
    """A packed row's positions restart per document; ours shifts them by pad + 1 as HF's table expects. Each side
    attends within its documents: ours by segment_ids, transformers (5.2x on) by finding where position_ids restart."""
    model_cfg = roberta_config()
    model, params = perturbed_params(model_cfg)
    batch = roberta_batch(2)
    batch["attention_mask"] = jnp.ones_like(batch["attention_mask"])
    batch["input_ids"] = jnp.where(batch["input_ids"] == PAD, 7, batch["input_ids"])
    packed = np.concatenate([np.arange(6), np.arange(10)])[None].repeat(4, axis=0).astype(np.int32)
    documents = np.concatenate([np.zeros(6), np.ones(10)])[None].repeat(4, axis=0).astype(np.int32)
    ours = np.asarray(model.apply({"params": params}, {**batch, "position_ids": jnp.asarray(packed),
                                                       "segment_ids": jnp.asarray(documents)})["mlm_logits"])
    plain = np.asarray(model.apply({"params": params}, batch)["mlm_logits"])
    assert relative_error(ours, plain) > 100 * TRANSFORMERS  # the positions are read, not ignored
    hf_model = exported_model(tmp_path, params, model_cfg)
    with torch.no_grad():
        logits = hf_model(input_ids=torch.tensor(np.asarray(batch["input_ids"])),
                          position_ids=torch.tensor(packed + PAD + 1)).logits.numpy()
    theirs = gathered(logits, batch["masked_positions"])
    assert relative_error(ours, theirs) <= TRANSFORMERS


@pytest.mark.parametrize("scan_layers", [True, False])
def test_hf_roberta_to_ours_to_hf_round_trips_every_tensor_exactly(scan_layers):
    model_cfg = roberta_config(scan_layers=scan_layers)
    torch.manual_seed(0)
    hf_model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**hf_roberta.hf_config(model_cfg)))
    original = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    params, report = hf_roberta.hf_to_params(original, model_cfg)
    assert report.kept_from_fallback == [] and report.unused == []
    again = hf_roberta.params_to_hf(params, model_cfg)
    names = set(original) - set(hf_roberta.IGNORED_ON_IMPORT)
    assert names == set(again)
    for name in sorted(names):
        np.testing.assert_array_equal(again[name], original[name], err_msg=name)


def full_state(model_cfg):
    rng = np.random.default_rng(0)
    return {s.hf_name: rng.standard_normal(s.hf_shape).astype(np.float32)
            for s in hf_roberta.tensor_specs(model_cfg)}


def test_roberta_import_errors_name_the_tensor_or_config_key():
    model_cfg = roberta_config()
    state = full_state(model_cfg)
    del state["roberta.encoder.layer.1.attention.self.value.bias"]
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*roberta\.encoder\.layer\.1\.attention\.self\.value\.bias"):
        hf_roberta.hf_to_params(state, model_cfg)
    state = full_state(model_cfg)
    state["lm_head.dense.weight"] = np.zeros((32, 31), np.float32)
    with pytest.raises(ValueError, match=r"lm_head\.dense\.weight has shape \(32, 31\)"):
        hf_roberta.hf_to_params(state, model_cfg)
    hf_cfg = hf_roberta.hf_config(model_cfg)
    with pytest.raises(ValueError, match="model_type='bert'"):
        get_family("roberta").hf.from_hf(full_state(model_cfg), {**hf_cfg, "model_type": "bert"}, model_cfg, None)
    with pytest.raises(ValueError, match=r"config\.model\.pad_token_id=1 .* pad_token_id=0"):
        get_family("roberta").hf.from_hf(full_state(model_cfg), {**hf_cfg, "pad_token_id": 0}, model_cfg, None)


def test_a_position_table_without_room_for_the_offset_fails_naming_the_key():
    import jax

    model = get_family("roberta").build_model(roberta_config(max_position_embeddings=16))
    with pytest.raises(ValueError, match=r"config\.model\.max_position_embeddings >= 18 .* it is 16"):
        jax.eval_shape(lambda: model.init(jax.random.key(0), roberta_batch(0)))


def test_a_roberta_model_checkpoint_imports_its_encoder_and_reports_the_unused_pooler():
    """RobertaModel folders (no `roberta.` prefix, a pooler, no lm_head) import; the head comes from the fallback."""
    model_cfg = roberta_config()
    torch.manual_seed(0)
    bare = transformers.RobertaModel(transformers.RobertaConfig(**hf_roberta.hf_config(model_cfg)))
    state = {k: v.numpy() for k, v in bare.state_dict().items()}
    fallback, _ = hf_roberta.hf_to_params(full_state(model_cfg), model_cfg)
    params, report = hf_roberta.hf_to_params(state, model_cfg, fallback_params=fallback)
    assert sorted(report.kept_from_fallback) == sorted(
        s.hf_name for s in hf_roberta.tensor_specs(model_cfg) if s.hf_name.startswith("lm_head."))
    assert report.unused == ["roberta.pooler.dense.bias", "roberta.pooler.dense.weight"]
    np.testing.assert_array_equal(params["encoder"]["embeddings"]["position"]["embedding"],
                                  state["embeddings.position_embeddings.weight"])


def test_a_roberta_exported_with_a_wordpiece_vocabulary_carries_its_special_ids(tmp_path):
    """RoBERTa's usual ids (<s>=0, </s>=2) are [PAD] and [CLS] in a WordPiece vocabulary: the folder's config.json
    names the vocabulary's own [CLS], [SEP] and [PAD], which transformers reads as bos, eos and pad."""
    import finetune_data as fd

    from data_pipelines.tokenizers import tokenizer as tokenizer_lib

    vocab = fd.write_tiny_hf_bert(str(tmp_path / "bert"))  # its WordPiece tokenizer: [PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3
    ids = tokenizer_lib.special_ids(tokenizer_lib.load_tokenizer(vocab))
    model_cfg = roberta_config(pad_token_id=ids.pad, max_position_embeddings=16 + ids.pad + 1)
    exported = get_family("roberta").hf.to_hf(random_params(get_family("roberta").build_model(model_cfg),
                                                            roberta_batch(0)), model_cfg)
    hf_folder.write_hf_folder(str(tmp_path / "out"), exported.state, exported.config, tokenizer_dir=vocab)
    config = transformers.AutoConfig.from_pretrained(str(tmp_path / "out"))
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (ids.cls, ids.sep, ids.pad) == (2, 3, 0)
