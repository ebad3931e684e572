import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_batch, small_model_config
from numerics import REORDERED, assert_close

from bert_jax.families import get_family, known_families
from bert_jax.models.bert import BertConfig, BertEncoder
from bert_jax.models.scan_layout import stack_layers, unstack_layers


def init(cfg, batch):
    model = get_family("bert").build_model(cfg)
    return model, nn.meta.unbox(model.init(jax.random.key(0), batch, deterministic=True))["params"]


def test_pretraining_outputs_have_prediction_and_nsp_shapes(batch):
    model, params = init(small_model_config(), batch)
    out = model.apply({"params": params}, batch)
    assert out["mlm_logits"].shape == (4, 5, 97)  # [batch, max_predictions, vocab], not [batch, length, vocab]
    assert out["nsp_logits"].shape == (4, 2)
    assert out["mlm_logits"].dtype == jnp.float32


def test_padding_never_changes_real_token_outputs(batch):
    cfg = small_model_config()
    encoder = BertEncoder(BertConfig.from_config(cfg))
    variables = encoder.init(jax.random.key(1), batch["input_ids"], batch["attention_mask"])
    hidden = encoder.apply(variables, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    noisy = jnp.where(batch["attention_mask"] == 1, batch["input_ids"], 42)
    hidden2 = encoder.apply(variables, noisy, batch["attention_mask"], batch["token_type_ids"])
    real = np.asarray(batch["attention_mask"], bool)
    # Exact: the same program, and padded keys get probability exactly 0 (bias finfo.min), adding nothing.
    np.testing.assert_array_equal(np.asarray(hidden)[real], np.asarray(hidden2)[real])
    assert not np.allclose(np.asarray(hidden)[~real], np.asarray(hidden2)[~real])


def test_packed_attention_never_crosses_documents(batch):
    cfg = small_model_config()
    encoder = BertEncoder(BertConfig.from_config(cfg))
    ids, mask = batch["input_ids"], jnp.ones_like(batch["input_ids"])
    segment_ids = jnp.asarray((np.arange(16) >= 7).astype(np.int32))[None].repeat(4, 0)  # docs [0,7) and [7,16)
    positions = jnp.asarray(np.concatenate([np.arange(7), np.arange(9)]))[None].repeat(4, 0)
    variables = encoder.init(jax.random.key(1), ids, mask)
    run = lambda x: encoder.apply(variables, x, mask, None, positions, segment_ids)  # noqa: E731
    changed = ids.at[:, 10:].set(3)  # edit only the second document
    a, b = np.asarray(run(ids)), np.asarray(run(changed))
    np.testing.assert_array_equal(a[:, :7], b[:, :7])  # the same program: the other document weighs exactly 0
    assert not np.allclose(a[:, 7:], b[:, 7:])
    # The first document alone, unpacked, gives the same states: nothing leaks in.
    alone = encoder.apply(variables, ids[:, :7], mask[:, :7])
    assert_close(a[:, :7], np.asarray(alone), REORDERED)  # 7 keys instead of 16: sums in another order


def test_scanned_and_unrolled_layers_compute_the_same_function(batch):
    scanned, params = init(small_model_config(scan_layers=True), batch)
    unrolled = get_family("bert").build_model(small_model_config(scan_layers=False))
    flat = unstack_layers(params)
    assert "layers_1" in flat["encoder"]["stack"] and "layers" not in flat["encoder"]["stack"]
    a = scanned.apply({"params": params}, batch)["mlm_logits"]
    b = unrolled.apply({"params": flat}, batch)["mlm_logits"]
    assert_close(np.asarray(a), np.asarray(b), REORDERED)  # one loop body vs two inlined layers: other fusions
    jax.tree.map(np.testing.assert_array_equal, stack_layers(flat), params)


@pytest.mark.parametrize("policy, scan", [pytest.param("full", True, marks=pytest.mark.slow), ("dots", False)])  # budget
def test_remat_changes_memory_not_results(batch, policy, scan):
    plain, params = init(small_model_config(scan_layers=scan), batch)
    remat = get_family("bert").build_model(small_model_config(remat_policy=policy, scan_layers=scan))

    def loss(model, p):
        return jnp.sum(model.apply({"params": p}, batch)["mlm_logits"] ** 2)

    g1, g2 = jax.grad(lambda p: loss(plain, p))(params), jax.grad(lambda p: loss(remat, p))(params)
    # The recomputed backward sums in another order: per-leaf error relative to the leaf's magnitude (issue 11).
    assert_close(g2, g1, REORDERED)


def test_bf16_compute_keeps_fp32_params(batch):
    model, params = init(small_model_config(dtype="bfloat16"), batch)
    assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype("float32")}
    out = model.apply({"params": params}, batch)
    assert out["mlm_logits"].dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(out["mlm_logits"])))


def test_every_parameter_carries_logical_axis_names(batch):
    model = get_family("bert").build_model(small_model_config())
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), batch, deterministic=True))["params"]
    leaves = jax.tree.leaves(boxed, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert leaves and all(isinstance(x, nn.LogicallyPartitioned) for x in leaves)
    allowed = {"batch", "length", "embed", "heads", "kv", "mlp", "vocab", "layers", None}
    assert all(set(x.names) <= allowed for x in leaves)


def test_unknown_family_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"known families: albert, bert, .*roberta"):
        get_family("gpt")
    assert "bert" in known_families()
    assert random_batch(1)["input_ids"].shape == (4, 16)
