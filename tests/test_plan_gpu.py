"""`plan --gpu`: XLA's GPU compiler compiles for an H100 on this CPU host (the `gpu` extra, not in the test extra:
the compiler's tests skip without it); the cards' target configs ship with the package; FLOPs are read from the
unoptimised program's dots, every loop's trips counted (no plugin needed for that).

The default tests compile a few-layer scan, not a model (the GPU compiler takes a minute on BERT-base); the train
step itself is compiled by the slow tests.
"""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from bert_jax import UserError
from bert_jax.plan import gpu_cards, hlo_flops, hlo_traffic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B, D = 64, 256  # a [64, 256] activation through [256, 256] layers
# The slow tests' micro BERT (4 layers, width 256, seq 128, batch 16), as a script's first lines: `c`.
MICRO_BERT = """
import jax
jax.config.update("jax_platforms", "cpu")
import bert_jax.configs.base
c = bert_jax.configs.base.get_config()
c.model.update(vocab_size=512, hidden_size=256, num_heads=4, intermediate_size=1024, num_layers=4,
               max_position_embeddings=128, dropout_rate=0.0)
c.data.update(max_seq_length=128, max_predictions_per_seq=20)
c.train.update(global_batch_size=16)
"""


def _run_script(script: str, timeout: int) -> subprocess.CompletedProcess:
    """`script` in a fresh process on the CPU (the GPU compiler compiles without a GPU); its exit status checked."""
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def layers(x, w):
    """A scanned stack: each layer a matmul and a GELU, as a scanned encoder's layers are."""
    def layer(h, w_l):
        return jax.nn.gelu(h @ w_l), None
    return jax.lax.scan(layer, x, w)[0].sum()


def abstract(n_layers, sharding=None):
    return (jax.ShapeDtypeStruct((B, D), jnp.bfloat16, sharding=sharding),
            jax.ShapeDtypeStruct((n_layers, D, D), jnp.bfloat16, sharding=sharding))


def test_every_card_ships_a_target_config_with_the_data_sheet_memory():
    for key, card in gpu_cards.CARDS.items():
        text = card.target_config
        assert f'device_description_str: "{card.device_kind}"' in text and 'platform_name: "CUDA"' in text
        # What the card reports is what is sold, in GiB, to within the ECC / reserved share.
        assert 0.95 * card.hbm_gib < card.device_memory_bytes / 1024**3 < 1.05 * card.hbm_gib + 2, key
        bandwidth = int(text.split("memory_bandwidth: ")[1].split()[0])
        assert bandwidth == card.hbm_bytes_per_s, key  # the roofline's bandwidth is the compiler's
    assert gpu_cards.parse_gpu("h100", 16).topology == "1x2x8"
    with pytest.raises(UserError, match="--gpu='h1000' is not a GPU the planner knows; known: h100"):
        gpu_cards.parse_gpu("h1000")
    with pytest.raises(UserError, match="--num_devices=12"):
        gpu_cards.parse_gpu("h100", 12)


def test_dot_flops_count_every_trip_of_a_scanned_stack_and_its_backward():
    """The forward's dots and the backward's two per layer (input and weight gradients), every layer counted: a
    count that took a loop's body once would see one layer of four."""
    lowered = jax.jit(jax.grad(layers, argnums=(0, 1))).lower(*abstract(4))
    flops, unread = hlo_flops.dot_flops(lowered.as_text(dialect="hlo"))
    assert unread == 0
    assert flops == 3 * 4 * (2 * B * D * D)


@pytest.fixture(scope="module")
def h100_scans():
    """The 2- and 4-layer stacks' train programs compiled for one H100 by XLA's GPU compiler (about 1 s)."""
    if not gpu_cards.plugin_available():
        pytest.skip(f"XLA's GPU compiler is not installed ({gpu_cards.GPU_INSTALL_HINT}); CI does not install it")
    devices = gpu_cards.gpu_devices(gpu_cards.parse_gpu("h100", 1))
    mesh = jax.sharding.Mesh(devices, ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    step = jax.jit(jax.grad(layers, argnums=(0, 1)))
    return devices, {n: step.lower(*abstract(n, replicated)).compile() for n in (2, 4)}


def test_the_gpu_compiler_counts_a_scanned_stacks_launches_and_bytes_by_its_trips(h100_scans):
    from bert_jax.models.attention import devices_platform

    devices, compiled = h100_scans
    assert devices[0].device_kind == "NVIDIA H100 80GB HBM3" and devices_platform(devices) == "gpu"
    assert compiled[4].cost_analysis() is None  # why FLOPs come from the dots of the unoptimised program
    two, four = (hlo_traffic.traffic(compiled[n].as_text()) for n in (2, 4))
    assert two.loops_counted_once == four.loops_counted_once == 0
    assert 4 in four.innermost_trips and 2 in two.innermost_trips
    # Two more layers: the same loop bodies run twice more each, so launches and bytes grow by whole layers, and
    # at least by the two more layers' weights read in the forward and in the backward.
    per_layer_launches = (four.launches - two.launches) / 2
    assert per_layer_launches >= 2 and per_layer_launches == int(per_layer_launches)
    assert four.hbm - two.hbm >= 2 * 2 * (D * D * 2)
    memory = compiled[4].memory_analysis()
    assert memory.argument_size_in_bytes == B * D * 2 + 4 * D * D * 2


@pytest.mark.slow
def test_a_micro_bert_train_step_planned_for_an_h100_by_the_gpu_compiler():
    """make_plan for a GPU set: memory from the GPU compiler, FLOPs near the formula's, launches and bytes counted
    by trips, the cuDNN kernel's FLOPs added, a verdict against 75 % of the card, a roofline."""
    if not gpu_cards.plugin_available():
        pytest.skip(f"XLA's GPU compiler is not installed ({gpu_cards.GPU_INSTALL_HINT})")
    script = MICRO_BERT + """
c.model.unroll_on_gpu = False  # a layer loop, whose trips the count must see (unrolled: no loop)
import json
from bert_jax.plan import compiled_plan, gpu_cards, plan_report
p = compiled_plan.make_plan(c, gpu_cards.parse_gpu("h100", 1))
r = p.roofline
print("RESULT " + json.dumps(dict(compiler=p.compiler, kernel=p.kernel, peak=p.peak_bytes, temp=p.temp_bytes,
    argument=p.argument_bytes, flops=p.compiled_flops, formula=p.formula_flops, kernel_flops=p.pallas_flops,
    launches=p.traffic.launches, hbm=p.hbm_bytes, trips=p.layer_loop_trips, fits=compiled_plan.fits(p)[0],
    bound=r.bound, text=plan_report.format_plan(p, param_table=False))))
"""
    proc = _run_script(script, timeout=900)
    import json
    r = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    assert r["compiler"] == "gpu" and r["kernel"] == "cudnn" and r["fits"]
    assert r["peak"] >= r["argument"] and r["temp"] > 0
    assert r["kernel_flops"] > 0 and 0.9 < (r["flops"] + r["kernel_flops"]) / r["formula"] < 1.3
    assert 4 in r["trips"] and r["launches"] > 100 and r["hbm"] > r["argument"]
    assert "XLA's GPU compiler" in r["text"] and "**fits**" in r["text"] and "kernel launches" in r["text"]


@pytest.mark.slow
def test_bert_base_on_one_h100_by_the_gpu_compiler_near_the_measured_peak():
    """Issue 58's acceptance. The program the H200 ran on 2026-11-26 (LayerNorm and GELU through autodiff, before
    bert_jax/kernels/lean_backward.py; the layer scan rolled, before config.model.unroll_on_gpu) planned for one
    H100: phase 1 (seq 128, batch 256) within 15 % of the 24.6 GiB measured (docs/results/gpu.md). Then the command as a user runs it, on today's code: it names the GPU
    compiler and judges phase 2 (seq 512) by that compiler's own figure."""
    if not gpu_cards.plugin_available():
        pytest.skip(f"XLA's GPU compiler is not installed ({gpu_cards.GPU_INSTALL_HINT})")
    measured_program = """
import jax
jax.config.update("jax_platforms", "cpu")
import bert_jax.configs.bert_base
from bert_jax.kernels import lean_backward
from bert_jax.plan import compiled_plan, gpu_cards
from bert_jax.plan.stage_plans import step_config
lean_backward.layer_norm = lambda x, s, b, eps, dtype: lean_backward._layer_norm_fwd(x, s, b, eps, dtype)[0]
lean_backward.gelu = lambda x: jax.nn.gelu(x, approximate=False)  # autodiff through both, as on 2026-11-26
c = bert_jax.configs.bert_base.get_config()
c.model.unroll_on_gpu = False  # the rolled layer scan of 2026-11-26
p = compiled_plan.make_plan(step_config(c), gpu_cards.parse_gpu("h100", 1))
print("RESULT", p.peak_bytes / 1024**3)
"""
    proc = subprocess.run([sys.executable, "-c", measured_program], cwd=REPO, capture_output=True, text=True,
                          timeout=3600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak = float(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT ")).split()[1])
    assert abs(peak - 24.6) / 24.6 < 0.15, peak
    proc = subprocess.run([sys.executable, "-m", "bert_jax.commands.plan", "--config=configs/bert_base.py", "--gpu=h100",
                           "--num_devices=1", "--max_param_rows=1"], cwd=REPO, capture_output=True, text=True,
                          timeout=3600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    out = proc.stdout
    print(out[out.find("## the run"):])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "come from XLA's GPU compiler" in out
    assert next(line for line in out.splitlines() if line.startswith("| 0 | 1-900,000 | 128 | 256 |")).endswith("| fits |")
    stage1 = next(line for line in out.splitlines() if line.startswith("| 1 | 900,001-1,000,000 | 512 | 256 |"))
    assert stage1.rstrip().endswith(("| fits |", "| does not fit |"))
    assert "XLA's GPU compiler's own figure" in out


@pytest.mark.slow
def test_plan_search_ranks_gpu_candidates_and_names_the_gpu_command():
    """`plan --gpu --search`: the search walks candidates compiled by XLA's GPU compiler as it does a TPU's, and its
    best's command names --gpu and --num_devices."""
    if not gpu_cards.plugin_available():
        pytest.skip(f"XLA's GPU compiler is not installed ({gpu_cards.GPU_INSTALL_HINT})")
    script = MICRO_BERT + """
from bert_jax.plan import gpu_cards, plan_search
from bert_jax.plan.stage_plans import step_config
tried = plan_search.search(step_config(c), gpu_cards.parse_gpu("h100", 1), remats=("none",), meshes=("dp",),
                           scans=(True,))
print(plan_search.format_search(tried, "h100", 1, flag="gpu", num_devices=1))
"""
    proc = _run_script(script, timeout=1800)
    assert "| 1 | True | dp | none | 16 x 1 |" in proc.stdout
    assert "python -m bert_jax.plan --config=CONFIG --gpu=h100 --num_devices=1 " in proc.stdout


@pytest.mark.slow
def test_packed_rows_plan_with_cudnn_for_a_hopper_card_on_a_host_without_one():
    """jax's cuDNN attention asks the host's GPU whether packed rows may run (Hopper or later); the planner answers
    for the target card, so crammed's packed, all-global rows plan with cuDNN for an H100 on a host without one."""
    if not gpu_cards.plugin_available():
        pytest.skip(f"XLA's GPU compiler is not installed ({gpu_cards.GPU_INSTALL_HINT})")
    script = """
import jax
jax.config.update("jax_platforms", "cpu")
import json
from bert_jax.configs import crammed
from bert_jax.plan import compiled_plan, gpu_cards
c = crammed.get_config("tiny")
c.model.dtype = "bfloat16"  # cuDNN's dtypes
c.train.batch_size_warmup.start_batch_size = 0  # one stage
c.train.update(global_batch_size=8, grad_accum_steps=1)
p = compiled_plan.make_plan(c, gpu_cards.parse_gpu("h100", 1))
print("RESULT " + json.dumps(dict(kernel=p.kernel, builder=c.data.example_builder, fits=compiled_plan.fits(p)[0])))
"""
    proc = _run_script(script, timeout=900)
    import json
    r = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    assert r["builder"] == "packed" and r["kernel"] == "cudnn" and r["fits"]


@pytest.mark.slow
def test_packed_rows_plan_without_cudnn_for_an_a100():
    """Issue 76: below Hopper jax refuses cuDNN's packed layout, so crammed's packed rows in bf16 planned for an A100
    take another kernel, named in the plan, and the plan completes (it ended in "Packed layout requires a GPU with at
    least Hopper architecture" while `auto` picked cuDNN whatever the card); unpacked rows keep cuDNN there."""
    if not gpu_cards.plugin_available():
        pytest.skip(f"XLA's GPU compiler is not installed ({gpu_cards.GPU_INSTALL_HINT})")
    script = """
import jax
jax.config.update("jax_platforms", "cpu")
import json
from bert_jax.configs import crammed
from bert_jax.plan import compiled_plan, gpu_cards, plan_report
c = crammed.get_config("tiny")
c.model.dtype = "bfloat16"  # what cuDNN would take
c.train.batch_size_warmup.start_batch_size = 0  # one stage
c.train.update(global_batch_size=8, grad_accum_steps=1)
p = compiled_plan.make_plan(c, gpu_cards.parse_gpu("a100_80gb", 1))
print("RESULT " + json.dumps(dict(kernel=p.kernel, builder=c.data.example_builder, fits=compiled_plan.fits(p)[0],
                                  text=plan_report.format_plan(p, param_table=False))))
"""
    proc = _run_script(script, timeout=900)
    import json
    r = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    assert r["builder"] == "packed" and r["kernel"] == "xla" and r["fits"]
    assert "attention kernel xla" in r["text"] and "A100" in r["text"]
    # Rows the program knows are unpacked (BERT's sentence pairs) keep cuDNN on the same card.
    proc = _run_script(MICRO_BERT + """
from bert_jax.plan import compiled_plan, gpu_cards
print("KERNEL", compiled_plan.make_plan(c, gpu_cards.parse_gpu("a100_80gb", 1)).kernel)
""", timeout=900)
    assert "KERNEL cudnn" in proc.stdout
