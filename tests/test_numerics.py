"""The comparison helper accepts the same maths in another order and rejects changed maths."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numerics import NOISE_FLOOR, REORDERED, assert_close


def test_float32_sums_in_any_order_agree_within_reordered():
    rng = np.random.default_rng(0)
    terms = (rng.standard_normal((97, 128)) * np.logspace(-3, 1, 97)[:, None]).astype(np.float32)
    pairwise = terms.sum(axis=1)  # numpy's pairwise summation
    sequential = np.zeros(97, np.float32)
    for column in terms.T[::-1]:  # one term at a time, backwards
        sequential += column
    exact = terms.astype(np.float64).sum(axis=1).astype(np.float32)
    assert not np.array_equal(pairwise, sequential)  # the orders really round differently
    assert_close(pairwise, exact, REORDERED)
    assert_close(sequential, exact, REORDERED)


def test_a_small_element_is_measured_against_its_tensor_not_itself():
    """Issue 11: on an AMD EPYC a remat gradient element of 6.8e-3, beside elements near 10, moved by 1.8e-6."""
    desired = np.full((97, 32), 0.5, np.float32)
    desired[0, 0], desired[71, 21] = 9.86, 0.006806932
    moved = desired.copy()
    moved[71, 21] = 0.006805095  # 27% of rtol=1e-4 of its own value, 2e-7 of the tensor's largest
    assert_close(moved, desired, REORDERED)
    moved[71, 21] += 2 * REORDERED * 9.86  # one element off by twice the bound fails the whole tensor
    with pytest.raises(AssertionError, match=r"\[71, 21\]"):
        assert_close(moved, desired, REORDERED)


def test_each_leaf_is_held_to_its_own_scale_and_noise_must_stay_noise():
    big, small = np.ones(8, np.float32), np.full(8, 4e-5, np.float32)  # like query kernel vs embedding grads
    noise = np.full(8, 1e-8, np.float32)  # like an attention key bias gradient: zero in exact arithmetic
    assert NOISE_FLOOR < 4e-5 and 1e-8 < NOISE_FLOOR
    desired = {"big": big, "small": small, "noise": noise}
    assert_close({"big": big, "small": small, "noise": -noise}, desired, REORDERED)  # noise redrawn: fine
    with pytest.raises(AssertionError, match="small"):  # 1e-4 of a leaf at 4e-5 of the tree is caught
        assert_close({"big": big, "small": small * (1 + 1e-4), "noise": noise}, desired, REORDERED)
    with pytest.raises(AssertionError, match="noise"):  # a leaf that should cancel but does not is caught
        assert_close({"big": big, "small": small, "noise": noise + 1e-4}, desired, REORDERED)
    with pytest.raises(AssertionError, match="step"):  # integers are exact
        assert_close({"step": np.int32(4), "x": big}, {"step": np.int32(5), "x": big}, REORDERED)


def layer(w, x):
    return jax.nn.gelu(x @ w, approximate=False)


def loss(params, x, layer_fn):
    return jnp.sum(layer_fn(params[1], layer_fn(params[0], x)) ** 2)


@jax.custom_vjp
def remat_saving_bf16(w, x):
    return layer(w, x)


def _save_input_in_bf16(w, x):
    return layer(w, x), (w, x.astype(jnp.bfloat16))


def _recompute_from_bf16(residuals, cotangent):
    w, x = residuals
    return jax.vjp(layer, w, x.astype(jnp.float32))[1](cotangent)


remat_saving_bf16.defvjp(_save_input_in_bf16, _recompute_from_bf16)


def test_a_remat_that_changes_the_maths_is_rejected():
    """jax.checkpoint recomputes the same maths and passes; a remat that keeps its residual in bfloat16 (the
    forward is untouched, the backward recomputes from a rounded input) fails."""
    rng = np.random.default_rng(0)
    params = [jnp.asarray(rng.standard_normal((32, 32)) / 6, jnp.float32) for _ in range(2)]
    x = jnp.asarray(rng.standard_normal((16, 32)), jnp.float32)
    grads = jax.jit(jax.grad(loss), static_argnums=2)
    plain = grads(params, x, layer)
    assert_close(grads(params, x, jax.checkpoint(layer)), plain, REORDERED)
    np.testing.assert_array_equal(loss(params, x, remat_saving_bf16), loss(params, x, layer))
    with pytest.raises(AssertionError, match="relative error"):
        assert_close(grads(params, x, remat_saving_bf16), plain, REORDERED)
