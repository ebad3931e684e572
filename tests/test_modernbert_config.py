"""ModernBERT's configs and schedules: bad input fails at config time naming the key; WSD and cosine have the
shapes the recipes promise."""
import numpy as np
import pytest

import bert_jax.configs.modernbert_base
import bert_jax.configs.modernbert_large
from bert_jax.train.config_validation import validate_config
from bert_jax.train.optimizer import learning_rate_schedule


def tiny(**model):
    c = bert_jax.configs.modernbert_base.get_config("tiny")
    for key, value in model.items():
        c.model[key] = value
    return c


@pytest.mark.parametrize("config", [bert_jax.configs.modernbert_base.get_config("tiny"),
                                    bert_jax.configs.modernbert_large.get_config("tiny"),
                                    bert_jax.configs.modernbert_base.get_config(),
                                    bert_jax.configs.modernbert_large.get_config()])
def test_modernbert_configs_validate(config):
    validate_config(config)
    assert config.data.example_builder == "packed" and config.data.mask_rate == 0.3
    assert config.train.schedule == "wsd"


@pytest.mark.parametrize("model, message", [
    (dict(local_attention=15), r"config\.model\.local_attention=15 must be an even number"),
    (dict(local_attention=256), r"config\.model\.local_attention=256 is larger than the sequence "
                                r"\(config\.data\.max_seq_length=128\)"),
    (dict(global_attn_every_n_layers=0), r"config\.model\.global_attn_every_n_layers=0 must be >= 1"),
    (dict(max_position_embeddings=64), r"config\.data\.max_seq_length=128 exceeds "
                                       r"config\.model\.max_position_embeddings=64"),
])
def test_bad_modernbert_config_fails_naming_the_key(model, message):
    with pytest.raises(ValueError, match=message):
        validate_config(tiny(**model))


def schedule(kind: str, **train):
    c = bert_jax.configs.modernbert_base.get_config("tiny").train
    c.schedule, c.num_steps, c.warmup_steps, c.learning_rate, c.end_learning_rate = kind, 100, 10, 1.0, 0.0
    for key, value in train.items():
        c[key] = value
    fn = learning_rate_schedule(c)
    return np.asarray(fn(np.arange(101)))


def test_wsd_warms_up_holds_the_peak_then_decays_as_one_minus_sqrt():
    lr = schedule("wsd", decay_fraction=0.2)
    np.testing.assert_allclose(lr[:11], np.linspace(0, 1, 11), atol=1e-6)
    np.testing.assert_allclose(lr[10:81], 1.0, atol=1e-6)
    np.testing.assert_allclose(lr[80:], 1 - np.sqrt(np.arange(21) / 20), atol=1e-6)


def test_cosine_and_linear_end_at_end_learning_rate():
    cosine, linear = schedule("cosine"), schedule("linear")
    assert cosine[10] == pytest.approx(1.0) and linear[10] == pytest.approx(1.0)
    assert cosine[55] == pytest.approx(0.5, abs=1e-6)  # half way through the cosine
    assert linear[55] == pytest.approx(0.5, abs=1e-6)
    assert cosine[100] == pytest.approx(0.0, abs=1e-6) and linear[100] == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match=r"config\.train\.schedule='step'"):
        schedule("step")
    with pytest.raises(ValueError, match=r"config\.train\.decay_fraction=0"):
        schedule("wsd", decay_fraction=0)


def test_auto_attention_avoids_cudnn_for_the_local_window_and_cudnn_fails_naming_the_key():
    from bert_jax.models.attention import choose_kernel

    model = tiny(dtype="bfloat16").model
    assert choose_kernel(model, platform="gpu", window=True).impl == "triton"  # the windowed Pallas kernel
    assert choose_kernel(model, platform="gpu").impl == "cudnn"  # families without windows keep cuDNN
    model.attention_impl = "cudnn"
    with pytest.raises(ValueError, match=r"attention_impl='cudnn' cannot apply .*config\.model\.local_attention"):
        choose_kernel(model, platform="gpu", window=True)
