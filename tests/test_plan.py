"""The planner compiles the real train step for N simulated devices and counts bytes exactly."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs in a fresh process: the planner must set the device count before JAX starts.
SCRIPT = """
import json, sys
sys.path.insert(0, "tests")
from bert_jax import plan
plan.use_simulated_devices(8)
import jax
from parallel_steps import initial_state, tiny_config
from bert_jax.parallel.mesh import make_mesh
from bert_jax.train.program import build_program

config = tiny_config((1, 8, 1), "fsdp_tp")
p = plan.make_plan(config)
state = jax.device_put(initial_state(config), build_program(config, make_mesh(config.mesh)).state_shardings)
device_bytes = lambda tree: sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))
out = dict(param_count=p.param_count, param_bytes=p.param_bytes, opt_state_bytes=p.opt_state_bytes,
           real_param_bytes=device_bytes(state.params), real_opt_state_bytes=device_bytes(state.opt_state),
           temp_bytes=p.temp_bytes, compiled_flops=p.compiled_flops, formula_flops=p.formula_flops,
           report=plan.format_plan(p, hbm_gib=1e-4))
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def plan():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, JAX_PLATFORMS="cpu",
                                    XLA_FLAGS="--xla_backend_optimization_level=0"))  # compiles 2x faster
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_parameter_bytes_are_count_times_four_over_the_shards(plan):
    # Every tensor but the [layers, heads, kv] attention biases, the MLM bias and the
    # NSP bias has an embed axis, split over fsdp's 8 devices.
    assert plan["param_count"] * 4 / 8 <= plan["param_bytes"] < plan["param_count"] * 4 / 6
    assert plan["param_bytes"] == plan["real_param_bytes"]  # what each device really holds


def test_optimizer_state_is_sharded_like_the_parameters(plan):
    assert plan["opt_state_bytes"] == plan["real_opt_state_bytes"]
    assert 2 * plan["param_bytes"] <= plan["opt_state_bytes"] < 2 * plan["param_bytes"] + 64  # Adam's moments


def test_report_has_memory_flops_fit_and_every_parameter(plan):
    assert plan["temp_bytes"] > 0
    # The compiler counts the scanned layer's body once and adds optimizer and
    # softmax work, so it is compared with the formula loosely.
    assert 0.2 * plan["formula_flops"] < plan["compiled_flops"] * 8 < 3 * plan["formula_flops"]
    report = plan["report"]
    assert "DOES NOT FIT in 0.0001 GiB" in report
    assert "| encoder/stack/layers/attention/query/kernel | (2, 64, 4, 16) | (None, 'fsdp', 'tensor', None) | " \
           "(2, 8, 4, 16) | float32 |" in report
