"""bert_jax/kernels/lean_backward.py: LayerNorm and GELU whose backward keeps only their input give the outputs of
flax's LayerNorm and jax's GELU bit for bit, and their gradients to rounding; a BERT train step's loss and gradients
equal those through autodiff of the plain ops."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.kernels import lean_backward

H = 64


def inputs(dtype):
    rng = np.random.default_rng(0)  # numpy: no eager JAX kernels to compile for the inputs
    x = jnp.asarray(rng.normal(size=(4, 16, H)) * 3 + 1, dtype)
    scale = jnp.asarray(1 + 0.1 * rng.normal(size=H), jnp.float32)
    bias = jnp.asarray(0.1 * rng.normal(size=H), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(4, 16, H)), jnp.float32)
    return x, scale, bias, cotangent


@pytest.mark.parametrize("dtype, use_bias", [(jnp.bfloat16, True), (jnp.float32, False)])
def test_layer_norm_equals_flax_forward_bit_for_bit_and_backward_to_rounding(dtype, use_bias):
    x, scale, bias, w = inputs(dtype)
    params = {"scale": scale, **({"bias": bias} if use_bias else {})}
    flax_norm = nn.LayerNorm(epsilon=1e-12, dtype=dtype, use_bias=use_bias)

    def reference(x, params):
        return jnp.sum(flax_norm.apply({"params": params}, x).astype(jnp.float32) * w)

    def lean(x, params):
        return jnp.sum(lean_backward.layer_norm(x, params["scale"], params.get("bias"), 1e-12, dtype)
                       .astype(jnp.float32) * w)

    assert jnp.array_equal(flax_norm.apply({"params": params}, x),
                           lean_backward.layer_norm(x, scale, bias if use_bias else None, 1e-12, dtype))
    expected, got = jax.jit(jax.grad(reference, argnums=(0, 1)))(x, params), jax.jit(jax.grad(lean, argnums=(0, 1)))(x, params)
    assert jax.tree.structure(expected) == jax.tree.structure(got)
    for e, g in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
        assert e.dtype == g.dtype
        tolerance = 1e-2 if e.dtype == jnp.bfloat16 else 1e-5  # bf16: one unit in the last place
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(e, np.float32), rtol=tolerance,
                                   atol=tolerance * float(jnp.max(jnp.abs(e.astype(jnp.float32)))))


def test_gelu_equals_jax_forward_bit_for_bit_and_backward_closer_to_float32():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(64, 256)) * 2, jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(64, 256)), jnp.float32)
    assert jnp.array_equal(lean_backward.gelu(x), jax.nn.gelu(x, approximate=False))
    autodiff = jax.jit(jax.grad(lambda x: jnp.sum(jax.nn.gelu(x, approximate=False).astype(jnp.float32) * w)))(x)
    lean = jax.jit(jax.grad(lambda x: jnp.sum(lean_backward.gelu(x).astype(jnp.float32) * w)))(x)
    exact = jax.jit(jax.grad(lambda x: jnp.sum(jax.nn.gelu(x, approximate=False) * w)))(x.astype(jnp.float32))
    error = lambda g: float(jnp.mean(jnp.abs(g.astype(jnp.float32) - exact)))  # noqa: E731
    assert error(lean) <= error(autodiff)  # float32 recomputation: no worse than bf16 autodiff
    np.testing.assert_allclose(np.asarray(lean, np.float32), np.asarray(autodiff, np.float32), atol=0.05)


@pytest.mark.slow
def test_a_bert_train_steps_loss_and_gradients_equal_autodiffs_through_the_plain_ops(monkeypatch):
    """The whole model, bf16 compute: swapping the lean norm and GELU for plain (autodiff) ones changes no loss and
    no gradient beyond rounding."""
    import conftest
    from bert_jax.families import get_family

    cfg = conftest.small_model_config(dtype="bfloat16", dropout_rate=0.0, attention_dropout_rate=0.0)
    model = get_family("bert").build_model(cfg)
    batch = conftest.random_batch(0)
    params = model.init({"params": jax.random.key(0)}, batch, deterministic=True)["params"]

    def loss(params):
        out = model.apply({"params": params}, batch, deterministic=True)
        return jnp.mean(jnp.square(out["mlm_logits"].astype(jnp.float32)))

    lean_loss, lean_grads = jax.jit(jax.value_and_grad(loss))(params)

    def plain_layer_norm(x, scale, bias, epsilon, dtype):
        return lean_backward._layer_norm_fwd(x, scale, bias, epsilon, dtype)[0]  # autodiff through the same ops

    monkeypatch.setattr(lean_backward, "layer_norm", plain_layer_norm)
    monkeypatch.setattr(lean_backward, "gelu", lambda x: jax.nn.gelu(x, approximate=False))
    plain_loss, plain_grads = jax.jit(jax.value_and_grad(loss))(params)
    assert float(lean_loss) == float(plain_loss)
    # Against the largest gradient: some are zero but for rounding (the key bias, under the softmax's shift).
    scale = max(float(jnp.max(jnp.abs(e))) for e in jax.tree.leaves(plain_grads))
    for (path, e), g in zip(jax.tree_util.tree_flatten_with_path(plain_grads)[0], jax.tree.leaves(lean_grads)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=1e-2 * scale, err_msg=jax.tree_util.keystr(path))
