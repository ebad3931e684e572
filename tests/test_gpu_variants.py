"""The GPU speed variants of issue 54, each a config key, pinned on the CPU at micro shapes.

Every variant must train the same numbers as the default (or, for a PRNG change, draw masks of the
same statistics), so that a faster variant measured on a GPU (bench/accelerator_throughput.py
--jax_variants, bench/gpu_variants.sh) can become a default without changing what is learnt.
"""
import functools
import json
import os
import subprocess

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax import UserError
from bert_jax.configs import base
from bert_jax.families import get_family
from bert_jax.models.attention import building_for, choose_kernel
from bert_jax.train.optimizer import make_optimizer
from bert_jax.train.state import make_init_fn
from bert_jax.train.step import DROPOUT_PRNGS, make_train_step, model_rngs
from conftest import random_batch, small_model_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = ml_collections.ConfigDict(dict(max_seq_length=16, max_predictions_per_seq=5, example_builder="nsp"))


def train_config(**overrides):
    """configs/base.py's train block (every key a layer reads is declared there), with these values."""
    cfg = base.get_config().train.to_dict()
    cfg.update(optimizer="adamw", learning_rate=1e-3, warmup_steps=2, num_steps=20, end_learning_rate=0.0,
               b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, max_grad_norm=1.0, schedule="linear",
               new_rows_warmup_steps=0, new_rows_start=0)
    cfg.update(overrides)
    return ml_collections.ConfigDict(cfg)


def losses(model_overrides=None, steps=2, dropout_prng="threefry", **train_overrides) -> np.ndarray:
    """The losses of `steps` train steps of a 2-layer BERT from seed 0 on fixed batches (dropout on)."""
    return _losses(tuple(sorted((model_overrides or {}).items())), steps, dropout_prng,
                   tuple(sorted(train_overrides.items()))).copy()


@functools.cache  # each configuration compiles once per test session
def _losses(model_overrides, steps, dropout_prng, train_overrides) -> np.ndarray:
    family = get_family("bert")
    model = family.build_model(small_model_config(**dict(model_overrides)))
    tx = make_optimizer(train_config(**dict(train_overrides)))
    state = jax.jit(make_init_fn(model, tx, DATA, seed=0))()
    step = jax.jit(make_train_step(model, family.objective, tx, 1, dropout_prng=dropout_prng))
    out = []
    for i in range(steps):
        state, metrics = step(state, random_batch(i))
        out.append(float(metrics["loss"]))
    return np.array(out)


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_flat_moments_give_the_per_leaf_updates(optimizer):
    """config.train.flat_moments: Adam over one raveled buffer is elementwise the same update."""
    rng = np.random.default_rng(0)
    params = {"dense": {"kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
                        "bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32)},
              "norm": {"scale": jnp.ones((3,), jnp.float32)}}
    txs = [make_optimizer(train_config(optimizer=optimizer, flat_moments=flat)) for flat in (False, True)]
    states = [tx.init(params) for tx in txs]
    assert jax.tree.leaves(states[1][1][0].mu)[0].shape == (4 * 3 + 3 + 3,)  # one buffer (after the clip)
    for i in range(3):
        grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
        out = []
        for k, tx in enumerate(txs):
            updates, states[k] = tx.update(grads, states[k], params)
            out.append(updates)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9), *out)


@pytest.mark.slow  # the default suite's time budget (2 cores): run with -m slow
def test_flat_moments_and_unrolled_scan_train_the_same_losses():
    """config.train.flat_moments and config.model.scan_unroll change the compiled program, not the dropout masks
    or the math (one compile for both: each is exact, so together they are). With the test model's 2 layers,
    unroll 2 is the whole stack unrolled; scan_layers=False computes the same function too (tests/test_model.py)."""
    np.testing.assert_allclose(losses({"scan_unroll": 2}, flat_moments=True), losses(), rtol=1e-5)


def test_an_nvidia_gpu_target_runs_the_scanned_stack_unrolled_and_other_platforms_keep_the_loop():
    """config.model.unroll_on_gpu (configs/base.py: on): on a GPU target a scan_unroll of 1 becomes the whole stack,
    parameters still stacked; an explicit scan_unroll, unroll_on_gpu=False, a remat policy and every other platform
    keep the loop.
    The unrolled program computes the same losses (test_flat_moments_and_unrolled_scan_train_the_same_losses)."""
    from bert_jax.models.bert import BertConfig
    from bert_jax.models.modernbert import ModernBertConfig

    def bert(**overrides):
        return BertConfig.from_config(small_model_config(**{"unroll_on_gpu": True, **overrides})).scan_unroll

    with building_for("gpu"):
        assert bert() == 2 and bert(num_layers=5) == 5
        assert bert(scan_unroll=3) == 3 and bert(unroll_on_gpu=False) == 1 and bert(remat_policy="dots") == 1
        assert ModernBertConfig.from_config(modernbert_config(unroll_on_gpu=True)).scan_unroll == 22
    for platform in ("cpu", "tpu"):
        with building_for(platform):
            assert bert() == 1
    assert base.get_config().model.unroll_on_gpu


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_rbg_dropout_keeps_the_rate_and_follows_from_the_key(impl):
    """config.train.dropout_prng: other masks than threefry's, the same keep rate, the same masks for the same key."""
    key = jax.random.key(3)

    def keep_mask(k):
        rngs = model_rngs(k, impl)
        return nn.Dropout(0.1).apply({}, jnp.ones((256, 256)), deterministic=False, rngs=rngs) != 0

    mask = keep_mask(key)
    assert abs(float(mask.mean()) - 0.9) < 0.005  # 65,536 draws: the standard error is 0.0012
    assert bool(jnp.all(mask == keep_mask(key)))
    threefry = nn.Dropout(0.1).apply({}, jnp.ones((256, 256)), deterministic=False, rngs=model_rngs(key)) != 0
    assert not bool(jnp.all(mask == threefry))
    assert jax.random.key_impl(model_rngs(key, impl)["dropout"]) == jax.random.key_impl(jax.random.key(0, impl=impl))


@pytest.mark.slow  # the default suite's time budget (2 cores): run with -m slow
def test_rbg_dropout_trains_like_threefry():
    """Other masks, so other losses, but of the same size."""
    theirs, ours = losses(dropout_prng="threefry"), losses(dropout_prng="unsafe_rbg")
    assert not np.array_equal(ours, theirs)
    np.testing.assert_allclose(ours, theirs, rtol=0.05)


def test_unknown_dropout_prng_fails_naming_the_key_and_the_choices():
    with pytest.raises(UserError, match=r"config.train.dropout_prng='philox' is not a PRNG; known: threefry, rbg"):
        make_train_step(None, None, None, 1, dropout_prng="philox")
    assert DROPOUT_PRNGS[0] == "threefry"


def modernbert_config(**overrides):
    from bert_jax.configs import modernbert_base

    m = modernbert_base.get_config().model
    m.update(dict(attention_dropout_rate=0.0, dtype="bfloat16"), **overrides)
    return m


def test_modernbert_local_layers_take_the_windowed_triton_kernel_on_a_gpu():
    """jax 0.10's cuDNN attention takes only a causal (left) window: ModernBERT's bidirectional local window
    cannot go through it, so `auto` picks our Pallas (Triton) kernel on a GPU and `cudnn` is refused naming the key."""
    family = get_family("modernbert")
    with building_for("gpu"):
        choice = family.kernel_choice(modernbert_config())
        assert choice.impl == "triton" and "window" in choice.reason
        with pytest.raises(ValueError, match=r"attention_impl='cudnn' cannot apply this model's sliding window"):
            family.kernel_choice(modernbert_config(attention_impl="cudnn"))


def test_cudnn_on_the_cpu_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"attention_impl='cudnn' needs an NVIDIA GPU") as refused:
        choose_kernel(small_model_config(attention_impl="cudnn", dtype="bfloat16", attention_dropout_rate=0.0),
                      platform="cpu")
    assert "\n" not in str(refused.value)


@pytest.mark.slow  # the default suite's time budget (2 cores): run with -m slow
def test_per_step_dropout_masks_train_like_per_layer_ones():
    """config.model.dropout_masks='per_step': every layer's masks in one draw; other masks, the same statistics."""
    per_layer, per_step = losses(), losses({"dropout_masks": "per_step"})
    assert not np.array_equal(per_step, per_layer)
    np.testing.assert_allclose(per_step, per_layer, rtol=0.05)


@pytest.mark.slow
def test_per_step_masks_change_nothing_without_dropout_scanned_or_not():
    no_dropout = {"dropout_rate": 0.0, "attention_dropout_rate": 0.0}
    for scan in (True, False):
        plain = {**no_dropout, "scan_layers": scan}
        np.testing.assert_array_equal(losses({**plain, "dropout_masks": "per_step"}), losses(plain))
    assert np.all(np.isfinite(losses({"dropout_masks": "per_step", "scan_layers": False})))


def test_per_step_masks_refused_for_a_family_that_draws_per_layer():
    from bert_jax.configs import modernbert_base
    from bert_jax.train.config_validation import validate_config

    c = modernbert_base.get_config()
    c.model.dropout_masks = "per_step"
    with pytest.raises(UserError, match=r"config.model.dropout_masks='per_step' does nothing on family 'modernbert'"):
        validate_config(c)


def test_unknown_dropout_masks_fail_naming_the_key():
    with pytest.raises(ValueError, match=r"dropout_masks='per_batch'; expected one of per_layer, per_step"):
        get_family("bert").build_model(small_model_config(dropout_masks="per_batch"))


@pytest.mark.slow
def test_step_anatomy_counts_the_backward_rng_and_update_apart():
    """bench/step_anatomy.py on a micro BERT: the parts docs/results/gpu.md reports, each found in the HLO."""
    from bench import step_anatomy

    micro = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=2", "model.intermediate_size=128",
             "model.dtype=float32"]
    texts = step_anatomy.compile_hlo("32:4", micro)
    train, forward = step_anatomy.anatomy(texts["train"]), step_anatomy.anatomy(texts["forward"])
    assert {"forward", "backward", "dropout RNG", "norms", "update"} <= set(train["parts"])
    assert "dropout RNG" not in forward["parts"]  # (its "update": a few entry copies without an op name)
    assert forward["parts"].get("update", {"kernels": 0})["kernels"] < train["parts"]["update"]["kernels"] / 4
    assert train["kernels"] > 2 * forward["kernels"] and train["bytes"] > 2 * forward["bytes"]
    rbg = step_anatomy.anatomy(step_anatomy.compile_hlo("32:4", micro + ["train.dropout_prng=rbg"])["train"])
    assert rbg["parts"]["dropout RNG"]["kernels"] < train["parts"]["dropout RNG"]["kernels"]


@pytest.mark.slow
def test_gpu_variants_script_runs_end_to_end_on_the_cpu(tmp_path):
    """bench/gpu_variants.sh, the one call a lent GPU runs, with a micro shape: the kernel checks pass, every
    variant and HF eager run in the same rounds and land as JSON lines."""
    micro = "mini:32:4"
    env = {**os.environ, "SHAPES": micro, "VARIANT_SHAPES": micro,
           "SIDES": "bert_jax,hf_eager", "STEPS": "1", "ROUNDS": "2", "WARMUP": "1", "BUDGET_S": "0", "ANATOMY": "0",
           "KERNEL_CHECK_FLAGS": "--width=64 --heads=2 --seq=32 --batch=4", "OUT": str(tmp_path),
           "JAX_PLATFORMS": "cpu"}
    subprocess.run(["bash", "bench/gpu_variants.sh"], cwd=REPO, env=env, check=True, timeout=3000)
    shape, done = [json.loads(line) for line in (tmp_path / "gpu_variants.jsonl").read_text().splitlines()]
    variants = ("rbg", "unsafe_rbg", "masks_per_step", "flat_adam", "unroll2", "unroll4", "rolled", "fused_norm",
                "fused_qkv", "all")
    expected = {"bert_jax", "hf_eager", *(f"bert_jax[{v}]" for v in variants)}
    assert set(shape["sides"]) == expected
    assert all(side["tokens_per_s"] > 0 for side in shape["sides"].values()), shape["sides"]
    assert {f"bert_jax[{v}]/bert_jax" for v in variants} <= set(shape["ratios"])
    assert done["run"] == "done" and done["shapes_left_out"] == []
    checks = json.loads((tmp_path / "kernel_checks.json").read_text())
    assert checks["ok"] and checks["dropout_add_layer_norm"]["mask_equal"], checks
