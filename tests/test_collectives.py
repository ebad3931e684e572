"""Every collective of a compiled step, its bytes per device per step and the link it crosses
(bert_jax/plan/collectives.py), and the bound that counts them (bert_jax/plan/roofline.py, links.py).

The default tests compile a scanned three-layer stack for four simulated CPU devices (about a second each): data
parallel, its gradients all-reduced; FSDP, its weights gathered in the forward and again in the backward. The CPU
compiler all-reduces FSDP's gradients (it forms no reduce-scatter): a reduce-scatter is pinned on its own
(`psum_scatter`), and the GPU compiler's FSDP step, reduce-scatters and all, by the slow test.
"""
import json
import os
import subprocess
import sys

import pytest

from bert_jax.parallel import tpu_slices
from bert_jax.plan import collectives, gpu_cards, links
from bert_jax.plan.roofline import LinkTime, Roofline

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
L, B, D, N = 3, 32, 64, 4  # layers, batch, width, devices
WEIGHT_BYTES = L * D * D * 4  # the stacked f32 weights, [L, D, D]

SCRIPT = f"""
import json
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from bert_jax.plan import collectives

def loss(w, x):
    def layer(h, w_l):
        return jnp.tanh(h @ w_l), None
    return jax.lax.scan(layer, x, w)[0].sum()

mesh = jax.make_mesh(({N},), ("d",))
batch = NamedSharding(mesh, P("d", None))
out = {{}}
for name, spec in (("dp", P()), ("fsdp", P(None, "d", None))):
    weights = NamedSharding(mesh, spec)
    compiled = jax.jit(jax.grad(loss), out_shardings=weights).lower(
        jax.ShapeDtypeStruct(({L}, {D}, {D}), jnp.float32, sharding=weights),
        jax.ShapeDtypeStruct(({B}, {D}), jnp.float32, sharding=batch)).compile()
    out[name] = compiled.as_text()
scatter = jax.jit(jax.shard_map(lambda g: jax.lax.psum_scatter(g, "d", tiled=True), mesh=mesh, in_specs=P(),
                                out_specs=P("d")))
out["scatter"] = scatter.lower(jax.ShapeDtypeStruct(({D}, {D}), jnp.float32)).compile().as_text()
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def programs() -> dict:
    """The optimised programs (HLO text) of the data-parallel and FSDP gradient steps and of a psum_scatter."""
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count"
                                   f"={N} --xla_backend_optimization_level=0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])


def _by_op(found, op):
    return [c for c in found if c.op == op]


def test_data_parallel_all_reduces_every_gradient_by_the_ring_factor(programs):
    found = collectives.collectives(programs["dp"])
    reduces = _by_op(found, "all-reduce")
    assert {c.op for c in found} == {"all-reduce"} and {c.group_size for c in reduces} == {N}
    payload = sum(c.payload * c.times for c in reduces)
    assert payload == WEIGHT_BYTES  # every layer's gradient, once per step, the loop's trips counted
    assert sum(c.within_bytes for c in reduces) == 2 * (N - 1) / N * WEIGHT_BYTES
    assert sum(c.between_bytes for c in reduces) == 0


def test_fsdp_gathers_every_layer_in_the_forward_and_again_in_the_backward(programs):
    found = collectives.collectives(programs["fsdp"])
    gathers = _by_op(found, "all-gather")
    assert {c.group_size for c in found} == {N}
    assert sum(c.payload * c.times for c in gathers) == 2 * WEIGHT_BYTES  # each gathered layer, twice
    assert sum(c.within_bytes for c in gathers) == (N - 1) / N * 2 * WEIGHT_BYTES
    # The CPU compiler reduces the sharded gradient with an all-reduce of the whole of it (and keeps its shard).
    reduces = _by_op(found, "all-reduce")
    assert sum(c.payload * c.times for c in reduces) == WEIGHT_BYTES
    assert sum(c.within_bytes for c in reduces) == 2 * (N - 1) / N * WEIGHT_BYTES


def test_a_reduce_scatter_sends_its_operand_by_the_ring_factor(programs):
    (scatter,) = collectives.collectives(programs["scatter"])
    assert scatter.op == "reduce-scatter" and scatter.group_size == N and scatter.times == 1
    assert scatter.payload == D * D * 4  # its operand: the result times the group
    assert scatter.within_bytes == (N - 1) / N * D * D * 4


def test_replica_groups_are_read_in_every_form_the_compilers_write():
    assert collectives._groups("replica_groups={{0,1},{2,3}}, dimensions", 4) == [[0, 1], [2, 3]]
    assert collectives._groups("replica_groups={}, to_apply", 4) == [[0, 1, 2, 3]]
    assert collectives._groups("replica_groups=[2,4]<=[8], use", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert collectives._groups("replica_groups=[4,2]<=[2,4]T(1,0), use", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # The mesh-axis form (jax 0.10): devices that differ only along the listed axes.
    assert collectives._groups("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, use", 8) == \
        [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert collectives._groups("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, use", 8) == \
        [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_a_group_across_two_nodes_sends_its_share_between_them():
    """16 GPUs, two nodes of 8: an all-reduce of P bytes sends 2(8-1)/8 P over NVLink within a node and
    2(2-1)/2 P / 8 over the network, each GPU carrying its eighth across (the two-level model's least)."""
    p = 8e6
    ring = collectives.Collective("all-reduce", p, 16, 2, True, 1.0, "grads")
    assert ring.within_bytes == 2 * 7 / 8 * p and ring.between_bytes == p / 8
    inside = collectives.Collective("all-gather", p, 8, 1, True, 3.0, "weights")
    assert inside.within_bytes == 3 * 7 / 8 * p and inside.between_bytes == 0
    # A TPU megascale send: the chip's share crosses DCN, 2(s-1)/s of it for an all-reduce over s slices.
    across = collectives.Collective("all-reduce", p, 4, 4, True, 1.0, "grads", crosses=True)
    assert across.within_bytes == 0 and across.between_bytes == 2 * 3 / 4 * p


def test_every_chip_and_card_has_its_links_with_a_source():
    for generation in tpu_slices.CHIPS:
        found = links.links_of(generation, is_gpu=False)
        assert found.within.name == "ICI" and found.within.source and found.between_name == "DCN"
    for key in gpu_cards.CARDS:
        found = links.links_of(key, is_gpu=True)
        assert found.within.name == "NVLink" and found.between.name == "network" and found.between.source
    # The pod's all-reduce bandwidth over its chips is half the bidirectional ICI figure (v5e: 51.2 TB/s / 256).
    assert links.links_of("v5e", is_gpu=False).within.bytes_per_s == 51.2e12 / 256
    with pytest.raises(KeyError, match=r"links.toml has no \[v9x.within\]"):
        links.links_of("v9x", is_gpu=False)


def test_the_bound_overlaps_asynchronous_collectives_and_adds_synchronous_ones():
    base = dict(flops=100e12, bytes=1e9, formula_flops=100e12, tokens=1000, peak_flops=1000e12, hbm_bytes_per_s=1e12)
    # compute 100 ms, memory 1 ms; NVLink's asynchronous 150 ms binds, and 5 ms of synchronous ones add to it.
    r = Roofline(**base, links=(LinkTime("NVLink", 0.150, 0.005),))
    assert r.bound == "NVLink-bound" and r.step_s == pytest.approx(0.155)
    assert r.mfu == pytest.approx(0.100 / 0.155)
    assert Roofline(**base).bound == "compute-bound" and Roofline(**base).step_s == pytest.approx(0.1)


GPU_SCRIPT = """
import json, math, jax
jax.config.update("jax_platforms", "cpu")
import bert_jax.configs.base
from bert_jax.plan import compiled_plan, gpu_cards
c = bert_jax.configs.base.get_config()
c.model.update(vocab_size=512, hidden_size=256, num_heads=4, intermediate_size=1024, num_layers=4,
               max_position_embeddings=128, dropout_rate=0.0)
c.data.update(max_seq_length=128, max_predictions_per_seq=20)
c.train.update(global_batch_size=16)
out = {}
for name, shape, n in (("fsdp", (1, -1, 1), 8), ("dp", (-1, 1, 1), 16)):
    c.mesh.shape = shape
    p = compiled_plan.make_plan(c, gpu_cards.parse_gpu("h100", n))
    out[name] = dict(
        found=[(x.op, x.payload * x.times, x.within_bytes, x.between_bytes, x.group_size, x.domains, x.asynchronous)
               for x in p.collectives],
        sharded=sum(math.prod(r.global_shape) for r in p.params if "fsdp" in r.spec),
        total=sum(math.prod(r.global_shape) for r in p.params),
        links=[(t.name, t.overlapped_s, t.serial_s) for t in p.roofline.links])
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_the_gpu_compilers_fsdp_step_gathers_and_reduce_scatters_over_nvlink_and_dp_crosses_two_nodes():
    """A 4-layer BERT (width 256) compiled by XLA's GPU compiler, deviceless (about 70 s): under FSDP on 8 H100s
    every sharded parameter is gathered and its gradient reduce-scattered, once a step (the GPU step runs its layers
    unrolled and keeps the gathered weights for the backward), at bf16 (matmul weights) to f32 (norms, tables), each
    sending (n-1)/n of it over NVLink; data parallel on 16 (two nodes of 8), the gradients' all-reduce sends
    2(8-1)/8 of them over NVLink and an eighth of them over the network, a term of the bound of its own."""
    if not gpu_cards.plugin_available():
        pytest.skip(f"XLA's GPU compiler is not installed ({gpu_cards.GPU_INSTALL_HINT})")
    proc = subprocess.run([sys.executable, "-c", GPU_SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=900,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])

    fsdp = out["fsdp"]
    for op in ("all-gather", "reduce-scatter"):
        rows = [f for f in fsdp["found"] if f[0] == op]
        payload = sum(f[1] for f in rows)
        assert 2 * fsdp["sharded"] <= payload < 4 * fsdp["sharded"], (op, payload, fsdp["sharded"])
        assert sum(f[2] for f in rows) == pytest.approx(7 / 8 * payload) and not any(f[3] for f in rows)
        assert {f[4] for f in rows} == {8}  # (start/done pairs; at this size the compiler leaves most synchronous)
    assert [name for name, *_ in fsdp["links"]] == ["NVLink"]

    dp = out["dp"]
    reduces = [f for f in dp["found"] if f[0] == "all-reduce"]
    payload = sum(f[1] for f in reduces)
    assert 2 * dp["total"] <= payload < 4 * dp["total"]  # every gradient, bf16 to f32
    assert {(f[4], f[5]) for f in reduces} == {(16, 2)}
    assert sum(f[2] for f in reduces) == pytest.approx(2 * 7 / 8 * payload)
    assert sum(f[3] for f in reduces) == pytest.approx(payload / 8)  # 2(2-1)/2 of each GPU's eighth
    links_ = dict((name, overlapped + serial) for name, overlapped, serial in dp["links"])
    assert links_["network"] == pytest.approx(payload / 8 / 50e9) and "NVLink" in links_
