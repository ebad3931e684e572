"""Coupled config keys resolve visibly or are refused at config time, naming both keys.

One test per coupling of docs/reference/configs.md ("Coupled keys"). All are pure: config
functions, the numpy masker and the eval-batch builder; nothing compiles.
"""
import logging

import numpy as np
import pytest

import bert_jax.configs.roberta_base
import bert_jax.configs.tiny
from bert_jax import UserError
from bert_jax.train.config_validation import check_config, resolve_config, validate_config
from data_pipelines.loader import masking, pipeline
from data_pipelines.tokenizers import tokenizer as tokenizer_lib
from data_pipelines.tokenizers.tokenizer import SpecialIds

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)


def _rows(batch: int, length: int, seed: int = 0) -> np.ndarray:
    """[batch, length] full rows as the full_sentences builder makes them: [CLS] ... [SEP]."""
    ids = np.random.default_rng(seed).integers(5, 2048, (batch, length))
    ids[:, 0], ids[:, -1] = SPECIAL.cls, SPECIAL.sep
    return ids


def _realised_rate(data_cfg, batch: int = 64) -> float:
    """Masks a 64 x max_seq_length batch as the pipeline would and returns the realised masked fraction."""
    masker = masking.Masker(masking.MaskingSpec.from_config(data_cfg), SPECIAL)
    out = masker(_rows(batch, data_cfg.max_seq_length), np.random.default_rng(1))
    return float(out["masked_weights"].sum() / out["maskable_tokens"].sum())


@pytest.mark.parametrize("variant", [None, "tiny"])
def test_auto_max_predictions_trains_a_mask_rate_sweep_at_its_rate(variant):
    for rate in (0.15, 0.3, 0.4):
        config = bert_jax.configs.roberta_base.get_config(variant)
        config.data.mask_rate = rate
        assert config.data.max_predictions_per_seq == "auto"
        resolved = resolve_config(config)
        assert resolved.data.max_predictions_per_seq == masking.expected_predictions(rate, config.data.max_seq_length)
        validate_config(resolved)
        assert abs(_realised_rate(resolved.data) - rate) < 0.01  # never 15 % silently


def test_auto_under_bernoulli_selection_gathers_the_whole_row_and_says_why(caplog):
    config = bert_jax.configs.roberta_base.get_config("tiny")
    config.data.mask_count = "bernoulli"
    with caplog.at_level(logging.INFO):
        resolved = resolve_config(config)
    length = config.data.max_seq_length
    assert resolved.data.max_predictions_per_seq == length  # any number of a row's tokens may be drawn
    assert f"max_predictions_per_seq=auto -> {length} (mask_count=bernoulli: the whole row" in caplog.text
    assert "ceil(mask_rate" not in caplog.text


def test_a_cap_that_binds_is_refused_naming_both_keys_and_the_value_that_fits():
    config = bert_jax.configs.roberta_base.get_config()
    config.data.mask_rate = 0.4
    config.data.max_predictions_per_seq = 80  # the probe: every arm trained at 15.7 %
    assert abs(_realised_rate(config.data) - 80 / 510) < 0.002  # what the cap did before it was refused
    with pytest.raises(ValueError, match=r"max_predictions_per_seq=80 caps config.data.mask_rate=0.4.*"
                                         r"max_predictions_per_seq=205 \(or auto"):
        validate_config(resolve_config(config))
    config.data.max_predictions_per_seq = 205  # a set cap that does not bind stays as set
    validate_config(resolve_config(config))


def test_expected_predictions_rounds_up_without_float_noise():
    assert masking.expected_predictions(0.15, 128) == 20  # 19.2
    assert masking.expected_predictions(0.15, 20) == 3  # 3.0000000000000004 in floats
    assert masking.expected_predictions(0.3, 1024) == 308
    with pytest.raises(ValueError, match="expected 'auto' or a number"):
        config = bert_jax.configs.tiny.get_config()
        config.data.max_predictions_per_seq = "most"
        masking.max_predictions(config.data)


def test_masked_fraction_counts_the_predicted_share_of_non_special_tokens():
    from bert_jax.train.step import masked_fraction  # noqa: PLC0415 (jax)

    batch = {"masked_weights": np.array([[1, 1, 0], [1, 0, 0]], np.float32), "maskable_tokens": np.array([4, 6])}
    assert float(masked_fraction(batch)) == pytest.approx(3 / 10)


def test_warmup_beyond_num_steps_is_refused():
    config = bert_jax.configs.tiny.get_config()
    config.train.warmup_steps = config.train.num_steps + 1
    with pytest.raises(ValueError,
                       match=r"config.train.warmup_steps=1001 must be in \[0, config.train.num_steps=1000\]"):
        validate_config(resolve_config(config))


@pytest.mark.parametrize("staged", [False, True])
def test_a_mask_rate_out_of_range_is_refused_naming_it_not_the_cap_it_derives(staged):
    config = bert_jax.configs.tiny.get_config()
    if staged:  # a stage's own mask rate: named with its stage
        config.train.stages = (dict(start=500, data=dict(mask_rate=1.5)),)
    else:
        config.data.mask_rate = 1.5
    with pytest.raises(UserError, match=r"config.data.mask_rate=1.5 must be in \(0, 1\)$") as refused:
        check_config(config)
    assert "max_predictions_per_seq" not in str(refused.value)
    assert ("config.train.stages[0] (from step 500)" in str(refused.value)) == staged


def test_packing_under_an_nsp_objective_is_refused_naming_the_builder():
    config = bert_jax.configs.tiny.get_config()  # bert: MLM + NSP
    config.data.example_builder = "packed"
    with pytest.raises(ValueError, match=r"family='bert' trains on batch key 'next_sentence_label'.*"
                                         r"example_builder='packed' does not produce"):
        validate_config(resolve_config(config))


def test_attention_dropout_under_auto_picks_xla_and_says_so_and_under_a_fused_kernel_is_refused():
    from bert_jax.models.attention import choose_kernel  # noqa: PLC0415

    config = bert_jax.configs.tiny.get_config()
    config.model.attention_dropout_rate = 0.1
    kernel = choose_kernel(config.model, platform="tpu")
    assert kernel.impl == "xla" and "dropout" in kernel.reason  # the start-up line logs the reason
    config.model.attention_impl, config.model.splash_interpret = "splash", True
    with pytest.raises(ValueError, match="attention_impl='splash' cannot apply config.model.attention_dropout_rate"):
        validate_config(resolve_config(config))


def test_an_eval_smaller_than_num_eval_batches_is_said(tmp_path, caplog):
    config = bert_jax.configs.tiny.get_config()
    data = resolve_config(config).data
    data.vocab_size, data.max_seq_length, data.tokenizer.sample_bytes = 512, 32, 100_000
    data.num_eval_batches, data.eval_fraction = 10_000, 0.01
    tokenizer = tokenizer_lib.prepare_tokenizer(data, str(tmp_path / "tokenizer"))
    with caplog.at_level(logging.WARNING):
        batches = pipeline.build_eval_batches(data, tokenizer, seed=0, per_host_batch_size=8)
    assert len(batches) < 10_000
    assert f"num_eval_batches=10000, but the eval split" in caplog.text
    assert f"evaluating on {len(batches)}" in caplog.text


def test_a_cosine_term_the_teacher_cannot_give_is_dropped_and_said(caplog):
    from bert_jax.train.program import cosine_applies  # noqa: PLC0415

    config = bert_jax.configs.tiny.get_config()  # hidden 128, distill.cosine_weight 1.0
    assert cosine_applies(config, 128)
    with caplog.at_level(logging.WARNING):
        assert not cosine_applies(config, 768)
    assert "config.distill.cosine_weight=1 is not applied: the teacher's hidden size 768 differs from " \
           "config.model.hidden_size=128" in caplog.text
