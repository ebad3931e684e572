"""The attention kernels agree with each other and with a dense numpy reference, for every mask.

Splash runs in Pallas interpret mode here (its kv block must be a multiple of 128, hence
length 128); cuDNN runs only where an NVIDIA GPU is present. One compiled program per kernel
and window is shared by the module-scoped fixtures.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_batch, small_model_config

from bert_jax.kernels import attention as kernels
from bert_jax.families import get_family
from bert_jax.models.attention import attention_mask_from_batch, choose_kernel, platform_name

B, L, HEADS, HEAD_DIM = 2, 128, 2, 8
WINDOW = 8
ON_GPU = platform_name() == "gpu"


def mask_rows() -> tuple[np.ndarray, np.ndarray]:
    """Row 0: one document of 100 tokens, then padding. Row 1: three packed documents, then padding."""
    attention_mask = np.zeros((B, L), np.int32)
    attention_mask[0, :100] = 1
    attention_mask[1, :120] = 1
    segment_ids = np.zeros((B, L), np.int32)
    segment_ids[0, :100] = 1
    segment_ids[1, :40], segment_ids[1, 40:90], segment_ids[1, 90:120] = 1, 2, 3
    return attention_mask, segment_ids


def dense_reference(q, k, v, attention_mask, segment_ids, window):
    """softmax(q k^T / sqrt(d)) v with an explicit [batch, q, k] mask, in float64 numpy."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    # Padding queries see no key here (their rows come out NaN): callers look at real tokens only.
    pos = np.arange(L)
    allowed = (segment_ids[:, :, None] == segment_ids[:, None, :]) & attention_mask[:, None, :].astype(bool)
    if window is not None:
        allowed &= np.abs(pos[:, None] - pos[None, :]) <= window
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HEAD_DIM)
    logits = np.where(allowed[:, None], logits, -np.inf)
    logits -= logits.max(-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", probs, v)


def run_kernel(impl: str, window, dtype=jnp.float32, seed: int = 0):
    """Outputs at real tokens and the gradients of a random projection of them w.r.t. q, k, v."""
    rng = np.random.default_rng(seed)
    q, k, v, cot = (jnp.asarray(rng.normal(size=(B, L, HEADS, HEAD_DIM)), dtype) for _ in range(4))
    attention_mask, segment_ids = mask_rows()
    mask = attention_mask_from_batch(jnp.asarray(attention_mask), jnp.asarray(segment_ids))
    real = jnp.asarray(attention_mask, dtype)[:, :, None, None]
    attend = {
        "xla": lambda q, k, v: kernels.xla_attention(q, k, v, mask.segments, window),
        "splash": lambda q, k, v: kernels.splash_attention(q, k, v, mask.segments, window, interpret=True),
        "cudnn": lambda q, k, v: kernels.cudnn_attention(q, k, v, mask.segments, window, packed=True),
    }[impl]
    loss = lambda q, k, v: jnp.sum((attend(q, k, v) * real * cot).astype(jnp.float32))  # noqa: E731
    out = jax.jit(attend)(q, k, v) * real
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    to_np = lambda x: np.asarray(x.astype(jnp.float32))  # noqa: E731
    return to_np(out), [to_np(g) for g in grads], (q, k, v, attention_mask, segment_ids)


@pytest.fixture(scope="module", params=[None, WINDOW], ids=["no_window", "window"])
def xla_result(request):
    return request.param, run_kernel("xla", request.param)


def test_xla_kernel_matches_a_dense_reference_for_padding_packing_and_window(xla_result):
    window, (out, _, (q, k, v, attention_mask, segment_ids)) = xla_result
    real = attention_mask[:, :, None, None].astype(bool)
    expected = np.where(real, dense_reference(q, k, v, attention_mask, segment_ids, window), 0.0)
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_packed_attention_never_crosses_documents():
    """Changing keys and values outside a document (or outside the window) leaves its outputs alone."""
    _, _, (q, k, v, attention_mask, segment_ids) = run_kernel("xla", None)
    mask = attention_mask_from_batch(jnp.asarray(attention_mask), jnp.asarray(segment_ids))
    for window, untouched in ((None, slice(0, 40)), (WINDOW, slice(0, 30))):
        attend = jax.jit(kernels.xla_attention, static_argnums=4)
        before = attend(q, k, v, mask.segments, window)
        k2, v2 = k.at[1, 40:].set(7.0), v.at[1, 40:].set(-7.0)  # row 1: everything after document 1
        if window is not None:  # row 0 is one document: edit only what lies beyond the window of 0..29
            k2, v2 = k2.at[0, 30 + WINDOW:].set(7.0), v2.at[0, 30 + WINDOW:].set(-7.0)
        after = attend(q, k2, v2, mask.segments, window)
        np.testing.assert_array_equal(np.asarray(before)[:, untouched], np.asarray(after)[:, untouched])
        assert not np.allclose(np.asarray(before)[1, 40:90], np.asarray(after)[1, 40:90])


def test_splash_matches_xla_outputs_and_gradients_in_fp32(xla_result):
    window, (out, grads, _) = xla_result
    s_out, s_grads, _ = run_kernel("splash", window)
    np.testing.assert_allclose(s_out, out, atol=1e-5)
    for a, b in zip(s_grads, grads):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, WINDOW], ids=["no_window", "window"])
def test_splash_matches_xla_outputs_and_gradients_in_bf16(window):
    out, grads, _ = run_kernel("xla", window, jnp.bfloat16)
    s_out, s_grads, _ = run_kernel("splash", window, jnp.bfloat16)
    np.testing.assert_allclose(s_out, out, atol=2e-2)
    for a, b in zip(s_grads, grads):
        np.testing.assert_allclose(a, b, atol=2e-2)


@pytest.mark.skipif(not ON_GPU, reason="cuDNN needs an NVIDIA GPU")
@pytest.mark.parametrize("dtype, tol", [(jnp.bfloat16, 2e-2), (jnp.float16, 2e-2)])
def test_cudnn_matches_xla_outputs_and_gradients(dtype, tol):
    out, grads, _ = run_kernel("xla", None, dtype)
    c_out, c_grads, _ = run_kernel("cudnn", None, dtype)
    np.testing.assert_allclose(c_out, out, atol=tol)
    for a, b in zip(c_grads, grads):
        np.testing.assert_allclose(a, b, atol=tol)


def test_segment_offsets_give_cudnn_each_documents_start_and_length():
    _, segment_ids = mask_rows()
    attention_mask, _ = mask_rows()
    mask = attention_mask_from_batch(jnp.asarray(attention_mask), jnp.asarray(segment_ids))
    offsets, lengths = jax.jit(kernels.segment_offsets, static_argnums=1)(mask.segments, 4)
    np.testing.assert_array_equal(offsets, [[0, -1, -1, -1, -1], [0, 40, 90, -1, -1]])
    np.testing.assert_array_equal(lengths, [[100, -1, -1, -1], [40, 50, 30, -1]])


@pytest.mark.slow  # ~40 s on 2 cores: splash interpreted inside the scanned model
def test_splash_and_xla_bert_give_the_same_outputs_and_gradients():
    """The whole model with attention_impl=splash (interpret) against xla: logits and parameter gradients."""
    batch = random_batch(0, batch=2, length=L, vocab=97)
    attention_mask, segment_ids = mask_rows()
    batch.update(attention_mask=jnp.asarray(attention_mask), segment_ids=jnp.asarray(segment_ids),
                 input_ids=batch["input_ids"] * jnp.asarray(attention_mask))
    results = []
    for impl in ("xla", "splash"):
        cfg = small_model_config(attention_impl=impl, splash_interpret=impl == "splash", max_position_embeddings=L,
                                 num_heads=HEADS, attention_dropout_rate=0.0, dropout_rate=0.0)
        model = get_family("bert").build_model(cfg)
        params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
        loss = lambda p: jnp.sum(model.apply({"params": p}, batch)["mlm_logits"] ** 2)  # noqa: E731
        results.append(jax.jit(jax.value_and_grad(loss))(params))
    (l1, g1), (l2, g2) = results
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), g1, g2)


@pytest.mark.parametrize("overrides, message", [
    (dict(attention_impl="cudnn"), "attention_impl='cudnn' needs an NVIDIA GPU.*'cpu'"),
    (dict(attention_impl="splash"), "attention_impl='splash' is a TPU kernel.*'cpu'.*splash_interpret"),
    (dict(attention_impl="flash"), "attention_impl='flash'; expected one of auto, xla, cudnn, splash"),
    (dict(attention_impl="splash", splash_interpret=True, attention_dropout_rate=0.1),
     "attention_impl='splash' cannot apply config.model.attention_dropout_rate=0.1"),
])
def test_a_kernel_the_platform_cannot_run_fails_before_compiling(overrides, message):
    with pytest.raises(ValueError, match=message):
        get_family("bert").build_model(small_model_config(**{"attention_dropout_rate": 0.0, **overrides}))


def test_cudnn_with_attention_dropout_fails_naming_both_keys():
    cfg = small_model_config(attention_impl="cudnn", dtype="bfloat16", attention_dropout_rate=0.1)
    with pytest.raises(ValueError, match=r"attention_impl='cudnn' cannot apply config.model.attention_dropout_rate"):
        choose_kernel(cfg, platform="gpu")


def test_cudnn_refuses_a_sliding_window_it_cannot_express():
    x = jnp.zeros((1, L, HEADS, HEAD_DIM), jnp.bfloat16)
    with pytest.raises(ValueError, match="attention_impl='cudnn' cannot apply a sliding window"):
        kernels.cudnn_attention(x, x, x, jnp.zeros((1, L), jnp.int32), WINDOW, packed=False)


@pytest.mark.parametrize("platform, overrides, impl, why", [
    ("tpu", {}, "splash", "TPU"),
    ("gpu", dict(dtype="bfloat16"), "cudnn", "cuDNN"),
    ("gpu", dict(dtype="float32"), "xla", "bf16/fp16"),
    ("gpu", dict(dtype="bfloat16", attention_dropout_rate=0.1), "xla", "attention_dropout_rate=0.1"),
    ("cpu", {}, "xla", "no fused kernel"),
])
def test_auto_picks_the_fastest_kernel_the_platform_and_dropout_allow(platform, overrides, impl, why):
    cfg = small_model_config(attention_impl="auto", **{"attention_dropout_rate": 0.0, **overrides})
    choice = choose_kernel(cfg, platform=platform)
    assert choice.impl == impl and why in choice.reason


@pytest.mark.slow  # two BERTs' gradients compiled: about 10 s quiet, 2 min under the shared CPU's load
def test_fused_projections_keep_the_parameters_and_give_the_same_loss_and_gradients():
    """config.model.fused_qkv: query, key and value as one matmul over their kernels side by side; the parameter
    tree, its init values, the loss and the gradients are the three Dense layers'."""
    batch = random_batch(0)
    models = [get_family("bert").build_model(small_model_config(fused_qkv=fused, attention_dropout_rate=0.0))
              for fused in (False, True)]
    params = [m.init({"params": jax.random.key(0)}, batch, deterministic=True)["params"] for m in models]
    jax.tree.map(np.testing.assert_array_equal, params[0], params[1])

    def value_and_grad(model):
        def loss(p):
            out = model.apply({"params": p}, batch, deterministic=False, rngs={"dropout": jax.random.key(1)})
            return jnp.mean(jnp.square(out["mlm_logits"]))
        return jax.jit(jax.value_and_grad(loss))(params[0])

    (loss, grads), (fused_loss, fused_grads) = map(value_and_grad, models)
    np.testing.assert_allclose(float(fused_loss), float(loss), rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), fused_grads, grads)
