"""The Pallas GPU (Triton) flash kernel with a sliding window (bert_jax/kernels/windowed_attention.py) equals the xla
reference, values and gradients, for every mask: a bidirectional window or none, packed documents of ragged
lengths, padding, lengths that are not a multiple of the tile; it never reads a tile outside the window or of
another document; `auto` picks it for windowed models on an NVIDIA GPU.

The kernel runs in Pallas interpret mode here. The default tests use micro shapes with 16-token tiles; ModernBERT's
window (local_attention 128: 64 tokens either side) with the GPU's tiles, bf16, the whole model, and the compile
for an H100 by XLA's GPU compiler, and the test that poisons the skipped tiles are slow.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import small_model_config

from bert_jax.families import get_family
from bert_jax.models.attention import choose_kernel
from bert_jax.kernels.attention import xla_attention
from bert_jax.kernels.windowed_attention import BlockSizes, segment_spans, windowed_attention

HEADS = 2
MICRO = BlockSizes(block_q=16, block_k=16, block_outer=16, block_inner=16)
# The interpreted kernels' XLA programs compile in about half the time without LLVM's optimizations; the values
# are the same, and the default suite's budget is what they save.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


def rows(length: int) -> np.ndarray:
    """[3, length] segment ids: row 0 one document then padding (-1); row 1 four packed documents of ragged
    lengths then padding; row 2 ids that are not whole runs (0, 1, then 0 again: the kernel's bounds fall back
    to the whole row), then padding."""
    seg = np.full((3, length), -1, np.int32)
    seg[0, :length * 3 // 4] = 0
    cuts = [0, length // 8, length // 3, length // 2, length * 7 // 8]
    for s, (a, b) in enumerate(zip(cuts, cuts[1:])):
        seg[1, a:b] = s + 1
    seg[2, :length * 7 // 8] = 0
    seg[2, length // 4:length // 2] = 1
    return seg


def outputs_and_gradients(attend, length: int, head_dim: int, dtype, seed: int = 0):
    """Outputs (every position: padding queries see the padding keys in both), and the gradients of a random
    projection of them w.r.t. q, k, v."""
    rng = np.random.default_rng(seed)
    segments = jnp.asarray(rows(length))
    q, k, v, cot = (jnp.asarray(rng.normal(size=(len(segments), length, HEADS, head_dim)), dtype) for _ in range(4))

    def loss(q, k, v):
        out = attend(q, k, v, segments).astype(jnp.float32)
        return jnp.sum(out * cot.astype(jnp.float32)), out

    grads, out = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True), compiler_options=FAST_COMPILE)(q, k, v)
    return out, grads


def assert_kernel_matches_xla(length: int, head_dim: int, window, dtype, tolerance: float, blocks=MICRO,
                              causal: bool = False):
    scale = 1.0 / np.sqrt(head_dim)  # the reference's; the kernel takes it as given
    kernel = lambda q, k, v, seg: windowed_attention(q, k, v, seg, window, scale, interpret=True,  # noqa: E731
                                                     blocks=blocks, causal=causal)
    reference = lambda q, k, v, seg: xla_attention(q, k, v, seg, window, causal=causal)  # noqa: E731
    want_out, want_grads = outputs_and_gradients(reference, length, head_dim, dtype)
    got_out, got_grads = outputs_and_gradients(kernel, length, head_dim, dtype)
    size = lambda x: max(1.0, float(jnp.max(jnp.abs(x.astype(jnp.float32)))))  # noqa: E731
    np.testing.assert_allclose(got_out, want_out, atol=tolerance * size(want_out), rtol=0)
    for name, got, want in zip("qkv", got_grads, want_grads):
        assert got.dtype == want.dtype
        err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
        assert err <= tolerance * size(want), f"d{name}: max error {err} against max {size(want)}"


def test_kernel_equals_xla_with_a_window_ragged_documents_padding_and_an_odd_length():
    """40 tokens in 16-token tiles (the tail padded inside the wrapper), head_dim 8 (padded to Triton's 16), a
    window of 5 either side: several tiles each way, some wholly outside a query block's window."""
    assert_kernel_matches_xla(length=40, head_dim=8, window=5, dtype=jnp.float32, tolerance=1e-5)


@pytest.mark.parametrize("window", [5, pytest.param(None, marks=pytest.mark.slow)])  # each ~3 s interpreted
def test_causal_kernel_equals_xla_with_ragged_documents_padding_and_an_odd_length(window):
    """A causal objective's mask (keys at or before the query, `window` back): the forward's key blocks end at the
    query block, the backward's query blocks start at the key block; values and gradients as the reference's."""
    assert_kernel_matches_xla(length=40, head_dim=8, window=window, dtype=jnp.float32, tolerance=1e-5, causal=True)


@pytest.mark.slow  # interpret-mode compiles, ~4 s each on 2 cores
@pytest.mark.parametrize("window", [None, 0, 64])
def test_kernel_equals_xla_global_and_at_the_edges_of_the_window(window):
    assert_kernel_matches_xla(length=72, head_dim=16, window=window, dtype=jnp.float32, tolerance=1e-5)


@pytest.mark.slow  # interpret mode with the GPU's tiles: ~30 s on 2 cores
@pytest.mark.parametrize("dtype, tolerance", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
@pytest.mark.parametrize("window", [64, None])
def test_kernel_equals_xla_at_modernberts_window_with_the_gpu_tiles(window, dtype, tolerance):
    """ModernBERT's local layers (local_attention 128: |i - j| <= 64) and its global ones, 300 tokens (not a
    multiple of the 128-token tile), head_dim 64, the default tiles; bf16 inputs with float32 statistics."""
    assert_kernel_matches_xla(length=300, head_dim=64, window=window, dtype=dtype, tolerance=tolerance,
                              blocks=BlockSizes())


@pytest.mark.slow  # an interpret-mode compile, ~2 s: the default suite keeps the equality test and the spans' one
def test_tiles_outside_the_window_or_the_document_are_never_read():
    """NaN keys and values in the tiles a query block has no business with. Row 0, one document: the last tile,
    beyond the window of queries 0..31. Row 1, two documents of two tiles each: the first document's second tile,
    inside the window of queries 32..47 but of another document. Those queries' outputs stay finite (xla's would
    not: 0 * NaN) and equal xla's with the tiles zeroed, which no query of theirs may see."""
    length, window = 64, 8
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.normal(size=(2, length, HEADS, 16)), jnp.float32) for _ in range(3))
    segments = np.zeros((2, length), np.int32)
    segments[1, 32:] = 1
    poisoned = np.zeros((2, length, 1, 1), bool)
    poisoned[0, 48:] = poisoned[1, 16:32] = True

    def both(q, k, v, segments):
        got = windowed_attention(q, jnp.where(poisoned, jnp.nan, k), jnp.where(poisoned, jnp.nan, v), segments,
                                 window, 0.25, interpret=True, blocks=MICRO)
        return got, xla_attention(q, jnp.where(poisoned, 0.0, k), jnp.where(poisoned, 0.0, v), segments, window)

    got, want = jax.jit(both, compiler_options=FAST_COMPILE)(q, k, v, jnp.asarray(segments))  # 0.25: 1 / sqrt(16)
    np.testing.assert_allclose(got[0, :32], want[0, :32], atol=1e-5, rtol=0)
    np.testing.assert_allclose(got[1, 32:], want[1, 32:], atol=1e-5, rtol=0)


def test_segment_spans_bound_each_document_and_widen_to_the_row_when_ids_repeat():
    """The loops' bounds: each token's document (or the padding) as [first, last] positions; a row whose ids are
    not whole runs (row 2: 0, 1, then 0 again) gets the whole row, so no key of its own id is ever left out."""
    seg = rows(16)  # row 1: documents [0, 2), [2, 5), [5, 8), [8, 14), then padding [14, 16)
    spans = np.asarray(jax.jit(segment_spans)(jnp.asarray(seg)))
    np.testing.assert_array_equal(spans[1, 0], [0, 0, 2, 2, 2, 5, 5, 5, 8, 8, 8, 8, 8, 8, 14, 14])
    np.testing.assert_array_equal(spans[1, 1], [1, 1, 4, 4, 4, 7, 7, 7, 13, 13, 13, 13, 13, 13, 15, 15])
    np.testing.assert_array_equal(spans[0, :, 11:13], [[0, 12], [11, 15]])  # the document's end, the padding's
    np.testing.assert_array_equal(spans[2], [[0] * 16, [15] * 16])


@pytest.mark.parametrize("platform, overrides, window, impl", [
    ("gpu", dict(dtype="bfloat16"), True, "triton"),
    ("gpu", dict(dtype="float16"), True, "triton"),
    ("gpu", dict(dtype="bfloat16"), False, "cudnn"),  # no window: cuDNN's kernel stays
    ("gpu", dict(dtype="float32"), True, "xla"),
    ("gpu", dict(dtype="bfloat16", attention_dropout_rate=0.1), True, "xla"),
    ("tpu", dict(dtype="bfloat16"), True, "splash"),
    ("cpu", dict(dtype="bfloat16"), True, "xla"),
])
def test_auto_picks_the_windowed_kernel_for_windowed_models_on_an_nvidia_gpu(platform, overrides, window, impl):
    cfg = small_model_config(attention_impl="auto", **{"attention_dropout_rate": 0.0, **overrides})
    assert choose_kernel(cfg, platform=platform, window=window).impl == impl


@pytest.mark.parametrize("platform, overrides, message", [
    ("cpu", {}, r"attention_impl='triton' is a Pallas GPU \(Triton\) kernel.*'cpu'.*splash_interpret"),
    ("gpu", dict(attention_dropout_rate=0.1), r"attention_impl='triton' cannot apply .*attention_dropout_rate=0.1"),
])
def test_triton_where_it_cannot_run_fails_naming_the_key(platform, overrides, message):
    cfg = small_model_config(attention_impl="triton", dtype="bfloat16", **{"attention_dropout_rate": 0.0,
                                                                             **overrides})
    with pytest.raises(ValueError, match=message):
        choose_kernel(cfg, platform=platform, window=True)
    assert choose_kernel(small_model_config(attention_impl="triton", splash_interpret=True,
                                            attention_dropout_rate=0.0), platform="cpu").impl == "triton"


def test_deberta_refuses_the_windowed_kernel_it_cannot_add_position_terms_to():
    from bert_jax.models.deberta_v3 import DebertaV3Config

    cfg = small_model_config(family="deberta_v3", attention_impl="triton", splash_interpret=True,
                             attention_dropout_rate=0.0)
    with pytest.raises(ValueError, match=r"attention_impl='triton'.*the windowed Triton kernel cannot"):
        DebertaV3Config.from_config(cfg)


@pytest.mark.slow  # the whole model, twice, interpreted: ~40 s on 2 cores
@pytest.mark.parametrize("objective", ["", "clm"])
def test_modernbert_with_the_windowed_kernel_equals_xla(objective):
    """ModernBERT (local and global layers, scanned) on packed rows with padding: the loss and every parameter's
    gradient with attention_impl=triton (interpret) equal xla's; as an encoder, and as a causal LM (Ettin's
    decoder: causal layers, the local ones looking back over local_attention // 2)."""
    import bert_jax.configs.modernbert_base

    length = 48
    rng = np.random.default_rng(0)
    segments = rows(length)[:2]  # packed rows as the pipeline builds them
    real = segments >= 0
    positions = np.zeros_like(segments)
    for r in range(2):
        for s in set(segments[r][real[r]]):
            where = np.flatnonzero(segments[r] == s)
            positions[r, where] = np.arange(where.size)
    batch = {
        "input_ids": jnp.asarray(rng.integers(5, 97, (2, length)) * real, jnp.int32),
        "attention_mask": jnp.asarray(real, jnp.int32),
        "segment_ids": jnp.asarray(np.where(real, segments, 0)),
        "position_ids": jnp.asarray(positions),
        "masked_positions": jnp.asarray([[1, 5, 20], [2, 30, 40]], jnp.int32),
        "masked_ids": jnp.asarray(rng.integers(5, 97, (2, 3)), jnp.int32),
        "masked_weights": jnp.ones((2, 3), jnp.float32),
    }
    results = []
    for impl in ("xla", "triton"):
        cfg = bert_jax.configs.modernbert_base.get_config("tiny").model
        cfg.update(vocab_size=97, num_layers=4, scan_layers=True, local_attention=16, attention_impl=impl,
                   splash_interpret=impl == "triton", objective=objective)
        model = get_family("modernbert").build_model(cfg)
        params = jax.jit(model.init)(jax.random.key(0), batch)["params"]
        logits = "clm_logits" if objective else "mlm_logits"
        loss = lambda p: jnp.sum(model.apply({"params": p}, batch)[logits] ** 2)  # noqa: E731
        results.append(jax.jit(jax.value_and_grad(loss))(params))
    (l1, g1), (l2, g2) = results
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), g1, g2)


@pytest.mark.slow  # XLA's GPU compiler with Triton, ~10 s per program on 2 cores; skips without the CUDA wheels
@pytest.mark.parametrize("head_dim, window", [(64, 64), (64, None), (128, 64)])
def test_the_kernel_compiles_for_an_h100_without_a_quadratic_buffer(head_dim, window):
    """Forward and backward built by XLA's GPU compiler for an H100 on this host (Triton to sm_90 code, its shared
    memory checked against the card's): Triton custom calls, and temporaries far below one [batch, heads, L, L]
    float32 score tensor, which xla attention keeps."""
    from bert_jax.plan import gpu_cards

    if not gpu_cards.plugin_available():
        pytest.skip(f"XLA's GPU compiler is not installed ({gpu_cards.GPU_INSTALL_HINT}); CI does not install it")
    devices = gpu_cards.gpu_devices(gpu_cards.parse_gpu("h100", 1))
    mesh = jax.sharding.Mesh(devices, ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    b, length, heads = 2, 2048, 4
    x = jax.ShapeDtypeStruct((b, length, heads, head_dim), jnp.bfloat16, sharding=replicated)
    segments = jax.ShapeDtypeStruct((b, length), jnp.int32, sharding=replicated)
    loss = lambda q, k, v, s: jnp.sum(windowed_attention(q, k, v, s, window, 0.125).astype(jnp.float32))  # noqa: E731
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x, segments).compile()
    assert compiled.as_text().count("__gpu$xla.gpu.triton") == 2  # the forward and the backward kernel
    scores = b * heads * length * length * 4
    assert compiled.memory_analysis().temp_size_in_bytes < scores / 8


@pytest.mark.slow  # XLA's GPU compiler for 8 H100s, ~15 s on 2 cores; skips without the CUDA wheels
def test_under_a_mesh_each_gpu_runs_the_kernel_on_its_own_rows_and_heads():
    """A Pallas call is not partitioned by XLA: `triton_attention` runs it in shard_map over the batch and heads
    axes, so each of 8 H100s (4-way data x 2-way tensor) gets its [2, L, 6, 64] shard and nothing is gathered."""
    import flax.linen as nn

    from bert_jax.kernels.attention import triton_attention
    from bert_jax.plan import gpu_cards

    if not gpu_cards.plugin_available():
        pytest.skip(f"XLA's GPU compiler is not installed ({gpu_cards.GPU_INSTALL_HINT}); CI does not install it")
    devices = gpu_cards.gpu_devices(gpu_cards.parse_gpu("h100", 8))
    mesh = jax.sharding.Mesh(np.array(devices).reshape(4, 2), ("data", "tensor"))
    x = jax.ShapeDtypeStruct((8, 512, 12, 64), jnp.bfloat16,
                             sharding=jax.sharding.NamedSharding(mesh, jax.P("data", None, "tensor", None)))
    segments = jax.ShapeDtypeStruct((8, 512), jnp.int32, sharding=jax.sharding.NamedSharding(mesh, jax.P("data")))

    def loss(q, k, v, s):
        return jnp.sum(triton_attention(q, k, v, s, 64, interpret=False).astype(jnp.float32))

    with jax.set_mesh(mesh), nn.logical_axis_rules((("batch", "data"), ("heads", "tensor"))):
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x, segments).compile().as_text()
    kernels = [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]
    assert len(kernels) == 2 and all("bf16[2,512,6,64]" in line for line in kernels)
    assert "all-gather" not in text
