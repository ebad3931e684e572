"""DeBERTa's fused disentangled-attention Pallas kernel (bert_jax/kernels/disentangled_attention.py) equals the xla
path (position terms as a [batch, heads, q, k] score bias), forward and backward, with padding and packed
segments, and with attention dropout (against xla given the kernel's mask); `auto` picks it on a TPU target.

The kernel runs in Pallas interpret mode here. Default tests use micro shapes with 16-token tiles (several
tiles each way, distances past the exact buckets); the TPU's 128-token tiles, bf16 and whole models are slow.
"""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax.families import get_family
from bert_jax.models import disentangled_attention as da
from bert_jax.kernels import disentangled_attention as kernel
from bert_jax.models.attention import building_for
from bert_jax.kernels.attention import xla_attention
from bert_jax.models.deberta_v3 import DebertaV3Config
from bert_jax.kernels.disentangled_attention import block_size

HEADS, HEAD_DIM, BUCKETS, MAX_POSITION = 2, 8, 8, 32


def rows(length: int) -> np.ndarray:
    """[2, length] segment ids: row 0 one document then padding (-1); row 1 four packed documents then padding."""
    seg = np.full((2, length), -1, np.int32)
    seg[0, :length * 3 // 4] = 0
    cuts = [0, length // 8, length // 3, length // 2, length * 7 // 8]
    for s, (a, b) in enumerate(zip(cuts, cuts[1:])):
        seg[1, a:b] = s + 1
    return seg


def xla_path(q, k, v, pos_q, pos_k, segments, kept=None, rate=0.0):
    """What DisentangledSelfAttention does with attention_impl='xla': the terms as a score bias; `kept`
    [batch, heads, q, k], when given, the dropout mask applied to the probabilities."""
    length = q.shape[1]
    index = da.relative_embedding_index(length, BUCKETS, MAX_POSITION)
    bias = da.disentangled_score_bias(q, k, pos_q, pos_k, index) / np.sqrt(da.SCORE_TERMS * HEAD_DIM)
    q_scaled = q * jnp.asarray(1.0 / np.sqrt(da.SCORE_TERMS), q.dtype)
    dropout = None if kept is None else (lambda p: jnp.where(kept, p / (1.0 - rate), 0.0).astype(p.dtype))
    return xla_attention(q_scaled, k, v, segments, None, probs_dropout=dropout, score_bias=bias)


def outputs_and_gradients(attend, length: int, dtype, seed: int = 0):
    """Outputs at real tokens, and the gradients of a random projection of them w.r.t. q, k, v, pos_q, pos_k."""
    rng = np.random.default_rng(seed)
    q, k, v, cot = (jnp.asarray(rng.normal(size=(2, length, HEADS, HEAD_DIM)), dtype) for _ in range(4))
    pos_q, pos_k = (jnp.asarray(rng.normal(size=(2 * BUCKETS, HEADS, HEAD_DIM)), dtype) for _ in range(2))
    segments = jnp.asarray(rows(length))
    real = (segments >= 0)[:, :, None, None]

    def loss(*args):
        out = attend(*args, segments).astype(jnp.float32)
        return jnp.sum(jnp.where(real, out * cot.astype(jnp.float32), 0.0)), out

    grads, out = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))(q, k, v, pos_q, pos_k)
    return jnp.where(real, out, 0.0), grads


SEED = jnp.asarray([20261126, -7], jnp.int32)


def assert_kernel_matches_xla(length: int, block: int | None, dtype, tolerance: float, rate: float = 0.0):
    """With rate > 0 the xla path drops the probabilities the kernel's own hash keeps (its whole mask)."""
    fused = lambda q, k, v, pq, pk, seg: da.fused_attention(  # noqa: E731
        q, k, v, pq, pk, seg, BUCKETS, MAX_POSITION, interpret=True, block=block, dropout_rate=rate,
        dropout_seed=SEED)
    kept = kernel.dropout_mask(kernel.dropout_keys(SEED, 2, HEADS), 2, HEADS, length, rate) if rate else None
    reference = lambda *args: xla_path(*args, kept=kept, rate=rate)  # noqa: E731
    want_out, want_grads = outputs_and_gradients(reference, length, dtype)
    got_out, got_grads = outputs_and_gradients(fused, length, dtype)
    scale = lambda x: max(1.0, float(jnp.max(jnp.abs(x.astype(jnp.float32)))))  # noqa: E731
    np.testing.assert_allclose(got_out, want_out, atol=tolerance * scale(want_out), rtol=0)
    for name, got, want in zip(("q", "k", "v", "pos_q", "pos_k"), got_grads, want_grads):
        err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
        assert err <= tolerance * scale(want), f"d{name}: max error {err} against max {scale(want)}"


def test_fused_kernel_equals_xla_forward_and_backward_across_tiles_with_padding_and_packing():
    # 64 tokens in 16-token tiles: 4 x 4 tiles, distances up to 63 over 8 buckets (log-bucketed past 4).
    assert_kernel_matches_xla(64, 16, jnp.float32, 1e-5)


def test_fused_kernel_with_attention_dropout_equals_xla_given_its_mask():
    # The forward and both backward kernels (query- and key-major tiles) draw one mask: any tile or grid-order
    # error in the hash's positions or keys shows as a mismatch against the whole mask applied in xla.
    assert_kernel_matches_xla(64, 16, jnp.float32, 1e-5, rate=0.25)


def test_dropout_mask_keeps_one_minus_the_rate_independently_per_row_head_and_seed():
    rate, length = 0.1, 128
    keys = kernel.dropout_keys(SEED, 4, 4)
    kept = np.asarray(kernel.dropout_mask(keys, 4, 4, length, rate), np.float64)  # 262,144 draws
    n = kept.size
    assert abs(kept.mean() - (1 - rate)) < 4 * np.sqrt(rate * (1 - rate) / n)
    # Neighbours along either axis, and across heads and rows, are uncorrelated (|r| < 4 / sqrt(n)).
    centred = kept - kept.mean()
    for a, b in ((centred[..., 1:], centred[..., :-1]), (centred[..., 1:, :], centred[..., :-1, :]),
                 (centred[:, 1:], centred[:, :-1]), (centred[1:], centred[:-1])):
        r = float(np.mean(a * b) / np.mean(centred ** 2))
        assert abs(r) < 4 / np.sqrt(a.size), r
    # Another seed (another layer or step) draws another mask; the same seed the same one.
    again = np.asarray(kernel.dropout_mask(kernel.dropout_keys(SEED, 4, 4), 4, 4, length, rate))
    other = np.asarray(kernel.dropout_mask(kernel.dropout_keys(SEED + 1, 4, 4), 4, 4, length, rate))
    assert np.array_equal(again, kept.astype(bool))
    assert abs(float(np.mean(other == kept.astype(bool))) - (rate ** 2 + (1 - rate) ** 2)) < 0.01
    # A shard's keys (its first global row and head) are the whole batch's keys of those rows and heads.
    shard = kernel.dropout_keys(SEED, 2, 2, batch_offset=2, head_offset=2).reshape(2, 2)
    np.testing.assert_array_equal(shard, keys.reshape(4, 4)[2:, 2:])


@pytest.mark.slow
@pytest.mark.parametrize("length, block", [(32, None), (256, None)])
def test_fused_kernel_equals_xla_at_one_tile_and_at_the_tpu_tile(length, block):
    assert_kernel_matches_xla(length, block, jnp.float32, 1e-5)


@pytest.mark.slow
def test_fused_kernel_equals_xla_in_bfloat16():
    assert_kernel_matches_xla(64, 16, jnp.bfloat16, 2e-2)


def deberta_model_config(**overrides) -> ml_collections.ConfigDict:
    cfg = dict(family="deberta_v3", vocab_size=97, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
               max_position_embeddings=64, type_vocab_size=0, position_buckets=BUCKETS,
               max_relative_positions=MAX_POSITION, dropout_rate=0.0, attention_dropout_rate=0.0,
               attention_impl="auto", dtype="float32", param_dtype="float32")
    cfg.update(overrides)
    return ml_collections.ConfigDict(cfg)


def test_auto_picks_the_fused_kernel_for_deberta_on_a_tpu_target_and_xla_elsewhere():
    with building_for("tpu"):
        assert DebertaV3Config.from_config(deberta_model_config()).attention_impl == da.FUSED_KERNEL
        assert DebertaV3Config.from_config(deberta_model_config(attention_impl="splash")).attention_impl == \
            da.FUSED_KERNEL
        # Its kernel applies attention dropout (the recipe's 0.1) itself.
        dropping = deberta_model_config(attention_dropout_rate=0.1)
        assert DebertaV3Config.from_config(dropping).attention_impl == da.FUSED_KERNEL
        splash = deberta_model_config(attention_dropout_rate=0.1, attention_impl="splash")
        assert DebertaV3Config.from_config(splash).attention_impl == da.FUSED_KERNEL
        assert get_family("deberta_v3").kernel_choice(dropping).impl == "splash"
        # Splash (every other family's TPU kernel) cannot: auto picks xla there, and splash is refused by name.
        assert get_family("bert").kernel_choice(dropping).impl == "xla"
        with pytest.raises(ValueError, match=r"attention_impl='splash'.*(?s:.*)attention_dropout_rate"):
            get_family("bert").kernel_choice(splash)
    for platform in ("cpu", "gpu"):
        with building_for(platform):
            assert DebertaV3Config.from_config(deberta_model_config()).attention_impl == "xla"
    with building_for("cpu"):
        interpreted = deberta_model_config(attention_impl="splash", splash_interpret=True)
        assert DebertaV3Config.from_config(interpreted).attention_impl == da.FUSED_KERNEL


def test_fused_kernel_on_tpu_refuses_a_length_off_its_tile_naming_the_key():
    assert block_size(512, interpret=False) == 128
    with pytest.raises(ValueError, match=r"max_seq_length.*got 100"):
        block_size(100, interpret=False)


@pytest.mark.slow
def test_deberta_model_with_the_fused_kernel_gives_xla_logits_and_gradients():
    from conftest import random_batch

    from bert_jax.models.deberta_v3 import build_deberta_v3_mlm

    results = {}
    for impl in ("xla", "splash"):
        cfg = deberta_model_config(attention_impl=impl, splash_interpret=impl == "splash", scan_layers=True)
        model = build_deberta_v3_mlm(cfg)
        batch = random_batch(0, batch=2, length=64)
        batch.pop("token_type_ids")
        params = model.init(jax.random.key(0), batch)["params"]

        def loss(p):
            logits = model.apply({"params": p}, batch)["mlm_logits"]
            return jnp.sum(logits * jnp.sin(jnp.arange(logits.size).reshape(logits.shape))), logits

        results[impl] = jax.jit(jax.grad(loss, has_aux=True))(params)
    (g_xla, l_xla), (g_fused, l_fused) = results["xla"], results["splash"]
    np.testing.assert_allclose(l_fused, l_xla, atol=1e-5, rtol=0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4), g_fused, g_xla)


def test_deberta_with_the_fused_kernel_drops_attention_by_its_dropout_key_in_every_scanned_layer():
    """The model path: each scanned layer's kernel takes a seed from the step's `dropout` rng; eval is exact."""
    from conftest import random_batch

    from bert_jax.models.deberta_v3 import build_deberta_v3_mlm

    batch = random_batch(0, batch=2, length=32)
    batch.pop("token_type_ids")
    build = lambda impl: build_deberta_v3_mlm(deberta_model_config(  # noqa: E731
        attention_impl=impl, splash_interpret=True, scan_layers=True, attention_dropout_rate=0.2))
    model = build("splash")
    params = jax.jit(build("xla").init)(jax.random.key(0), batch)["params"]  # the same parameters, quicker
    logits = jax.jit(lambda key, deterministic: model.apply(
        {"params": params}, batch, deterministic=deterministic, rngs={"dropout": key})["mlm_logits"],
        static_argnums=1)
    exact = logits(jax.random.key(1), True)  # eval: no dropout, whatever the key
    np.testing.assert_array_equal(logits(jax.random.key(2), True), exact)
    first, again, other = (logits(jax.random.key(k), False) for k in (1, 1, 2))
    np.testing.assert_array_equal(first, again)
    # Small weights (initializer_range 0.02) make attention's share of the logits small: differences of ~1e-3.
    assert float(jnp.max(jnp.abs(first - exact))) > 1e-4 and float(jnp.max(jnp.abs(first - other))) > 1e-4


@pytest.mark.slow
def test_tiny_deberta_pretraining_gives_the_same_losses_with_the_fused_kernel(tmp_path):
    """configs/deberta_v3_base.py:tiny for 20 steps (its 64 tokens are one interpret-mode tile, 16 buckets):
    the fused kernel in interpret mode against xla, loss for loss."""
    import shutil

    import bert_jax.configs.deberta_v3_base
    from test_pretrain import train_losses

    from bert_jax.train.loop import train_and_evaluate

    losses = {}
    for impl in ("xla", "splash"):
        c = bert_jax.configs.deberta_v3_base.get_config("tiny")
        c.model.attention_impl, c.model.splash_interpret = impl, impl == "splash"
        c.logging.plots = False
        c.logging.peak_flops_per_device = 1e11  # skip the matmul measurement
        c.train.num_steps, c.train.log_every_steps, c.train.warmup_steps = 20, 1, 5
        c.train.eval_every_steps = c.checkpoint.every_steps = 20
        c.data.num_eval_batches = 1
        if impl == "splash":  # the same tokenizer, not trained again
            shutil.copytree(str(tmp_path / "xla" / "tokenizer"), str(tmp_path / impl / "tokenizer"))
        train_and_evaluate(c, str(tmp_path / impl))
        losses[impl] = [loss for _, loss in train_losses(str(tmp_path / impl))]
    assert len(losses["xla"]) == 20
    np.testing.assert_allclose(losses["splash"], losses["xla"], rtol=2e-3)


MOSAIC_COMPILE = """
import jax, jax.numpy as jnp
from jax.experimental import topologies
from bert_jax.models import disentangled_attention as da
device = topologies.get_topology_desc(topology_name="v5e:2x2", platform="tpu").devices[0]
arg = lambda shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype,
                                                          sharding=jax.sharding.SingleDeviceSharding(device))
qkv = arg((2, 512, 2, 64))
for rate in (0.0, 0.1):  # without dropout, and with the hash's int32 arithmetic and its keys in SMEM
    loss = lambda *a: jnp.sum(da.fused_attention(*a[:6], 256, 512, False, dropout_rate=rate, dropout_seed=a[6]
                                                 ).astype(jnp.float32))
    jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4))).lower(qkv, qkv, qkv, arg((512, 2, 64)), arg((512, 2, 64)),
                                                          arg((2, 512), jnp.int32), arg((2,), jnp.int32)).compile()
    print("COMPILED", rate)
"""


def test_fused_kernel_forward_and_backward_compile_with_mosaic_for_a_tpu():
    """The TPU compiler (libtpu, the `tpu` extra) lowers every op of the three kernels at DeBERTa's shapes: 512
    tokens in 128-token tiles, head_dim 64, bf16, with and without dropout (interpret mode would accept what
    Mosaic refuses)."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed (pip install -e '.[tpu]')")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, JAX_PLATFORMS="cpu", ALLOW_MULTIPLE_LIBTPU_LOAD="1", TPU_SKIP_MDS_QUERY="1")
    proc = subprocess.run([sys.executable, "-c", MOSAIC_COMPILE], cwd=repo, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0 and "COMPILED 0.1" in proc.stdout, proc.stderr[-4000:]


UNDER_A_MESH = """
import jax, jax.numpy as jnp, numpy as np
import flax.linen as nn
jax.config.update("jax_num_cpu_devices", 4)
from bert_jax.models import disentangled_attention as da
rng = np.random.default_rng(0)
q, k, v, cot = (jnp.asarray(rng.normal(size=(4, 32, 2, 8)), jnp.float32) for _ in range(4))
pos_q, pos_k = (jnp.asarray(rng.normal(size=(16, 2, 8)), jnp.float32) for _ in range(2))
segments = jnp.asarray(np.repeat(np.arange(2), 16)[None].repeat(4, 0), jnp.int32)
seed = jnp.asarray([3, 4], jnp.int32)
mesh = jax.make_mesh((2, 2), ("data", "tensor"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
errors = []
for rate in (0.0, 0.3):  # with dropout each shard draws the mask of its global rows and heads
    loss = lambda *a: jnp.sum(da.fused_attention(*a, segments, 8, 32, True, dropout_rate=rate,
                                                 dropout_seed=seed) * cot)
    grads = lambda: jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(q, k, v, pos_q, pos_k)
    alone = grads()
    with jax.set_mesh(mesh), nn.logical_axis_rules([("batch", "data"), ("heads", "tensor")]):
        sharded = grads()
    errors.append(max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(alone, sharded)))
print("ERROR", max(errors))
"""


@pytest.mark.slow
def test_fused_kernel_under_a_mesh_gives_the_gradients_of_one_device():
    """In shard_map over batch (data) and heads (tensor): each device's partial table gradients are summed over
    the batch shards, so the relative projections' gradients equal one device's; with dropout too."""
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", UNDER_A_MESH], cwd=repo, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    error = float(next(line for line in proc.stdout.splitlines() if line.startswith("ERROR")).split()[1])
    assert error < 1e-5
