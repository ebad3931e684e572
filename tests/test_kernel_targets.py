"""Hardware-dependent choices follow the target's card: `attention_impl=auto` never picks cuDNN where the card's rules
refuse it (packed rows below Hopper, head_dim, pre-Ampere), an explicit `cudnn` the card cannot run fails naming the
key before anything compiles, and the planner tells GPUs from TPUs by the card's type. No GPU and no CUDA wheels are
needed: the rules read the card's description (bert_jax/plan/gpu_cards.py); the plans that compile for an A100 are
in tests/test_plan_gpu.py.
"""
import dataclasses
import types

import pytest

from bert_jax.configs import tiny
from bert_jax.models.attention import choose_kernel
from bert_jax.models.targets import Target, building_for, target
from bert_jax.parallel import tpu_slices
from bert_jax.plan import gpu_cards, links
from bert_jax.train.config_validation import validate_config
from conftest import small_model_config

A100 = gpu_cards.CARDS["a100_80gb"].compute_capability
H100 = gpu_cards.CARDS["h100"].compute_capability


def bf16(**overrides):
    """BERT-base's attention shape in miniature: bf16, head_dim 64, no attention dropout."""
    return small_model_config(**{"attention_impl": "auto", "dtype": "bfloat16", "hidden_size": 256, "num_heads": 4,
                                 "attention_dropout_rate": 0.0, **overrides})


def test_the_cards_report_their_compute_capability():
    assert A100 == (8, 0) and H100 == (9, 0) and gpu_cards.CARDS["h200"].compute_capability == (9, 0)


def test_auto_on_an_a100_with_packed_rows_is_not_cudnn():
    """jax refuses cuDNN's packed layout below Hopper: on an A100, packed rows (or rows that may be) get another
    kernel, named with why; unpacked rows keep cuDNN, and a Hopper card packs."""
    choice = choose_kernel(bf16(), platform="gpu", compute_capability=A100, packed=True)
    assert choice.impl != "cudnn" and "Hopper" in choice.reason and "sm_80" in choice.reason
    assert choose_kernel(bf16(), platform="gpu", compute_capability=A100, packed=None).impl != "cudnn"
    assert choose_kernel(bf16(), platform="gpu", compute_capability=A100, packed=False).impl == "cudnn"
    assert choose_kernel(bf16(), platform="gpu", compute_capability=H100, packed=True).impl == "cudnn"


def test_the_target_carries_the_card_and_the_rows_into_the_choice():
    """A plan names the card (its compute capability), the program inside it the rows: the inner target keeps the
    card, so `auto` resolved with neither passed follows both."""
    with building_for("gpu", A100):
        assert choose_kernel(bf16()).impl != "cudnn"  # rows not known yet: they may be packed
        with building_for("gpu", packed_rows=True):
            assert target() == Target("gpu", A100, True)
            assert choose_kernel(bf16()).impl != "cudnn"
        with building_for("gpu", packed_rows=False):
            assert choose_kernel(bf16()).impl == "cudnn"
        with building_for("tpu"):  # another platform: the card does not carry over
            assert target() == Target("tpu") and choose_kernel(bf16()).impl == "splash"


def test_cudnn_head_dim_and_architecture_follow_the_card():
    """head_dim up to 256 from Hopper, 128 before; no cuDNN fused attention before Ampere."""
    wide = bf16(hidden_size=512, num_heads=2)  # head_dim 256
    assert choose_kernel(wide, platform="gpu", compute_capability=H100, packed=False).impl == "cudnn"
    refused = choose_kernel(wide, platform="gpu", compute_capability=A100, packed=False)
    assert refused.impl == "xla" and "up to 128" in refused.reason
    volta = choose_kernel(bf16(), platform="gpu", compute_capability=(7, 0), packed=False)
    assert volta.impl == "xla" and "Ampere" in volta.reason


def test_an_explicit_cudnn_the_card_cannot_run_fails_naming_the_key_before_compiling():
    """configs/tiny.py with packed rows (MLM alone: roberta's objective) and attention_impl=cudnn, validated for an
    A100: one line naming the key and the card's limit. For an H100 it validates."""
    config = tiny.get_config()
    config.data.example_builder = "packed"
    config.model.family = "roberta"
    config.model.update(dtype="bfloat16", attention_impl="cudnn", attention_dropout_rate=0.0)
    with building_for("gpu", A100):
        with pytest.raises(ValueError, match=r"attention_impl='cudnn' cannot run here: .*packed rows.*sm_80"):
            validate_config(config, 1)
    with building_for("gpu", H100):
        validate_config(config, 1)


def test_links_follow_the_cards_type_not_its_attributes():
    """A TPU chip is read from its generation's table even if it carries a `key` as a GPU card does; a card from
    its own."""
    v5e = tpu_slices.CHIPS["v5e"]
    keyed = dataclasses.make_dataclass("KeyedChip", [("key", str, "h100")], bases=(tpu_slices.TpuChip,), frozen=True)
    chip = keyed(**dataclasses.asdict(v5e))
    assert links.links_for(types.SimpleNamespace(chip=chip)).within.name == "ICI"
    assert links.links_for(gpu_cards.parse_gpu("a100_80gb", 8)).within.name == "NVLink"
