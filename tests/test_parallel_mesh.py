"""DP, FSDP, TP and mixed meshes train identically; parameters are really split; checkpoints move between meshes.

The meshes run on 8 simulated CPU devices in one subprocess (tests/parallel_steps.py):
this pytest process has already started JAX with one device.
"""
import json
import os
import subprocess
import sys

import pytest
from numerics import REORDERED, assert_close

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESHES = ["(1, 1, 1)", "(8, 1, 1)", "(1, 8, 1)", "(1, 2, 4)", "(2, 2, 2)"]
SAVE_AT, STEPS = 3, 5


# Without LLVM's optimisations the 8-device CPU programs compile in half the time; every
# mesh, the single-device one included, is compiled alike, so the comparison stands.
FAST_COMPILE = "--xla_backend_optimization_level=0"


def run_parallel_steps(args: list[str], env_devices: int = 8, timeout: int = 600,
                       script: str = "parallel_steps.py") -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={env_devices} {FAST_COMPILE}")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", script), *args],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def mesh_runs(tmp_path_factory):
    meshes = ";".join(m.strip("()").replace(" ", "") for m in MESHES)
    return run_parallel_steps([f"--meshes={meshes}", f"--steps={STEPS}", f"--save_at={SAVE_AT}",
                               f"--checkpoint_dir={tmp_path_factory.mktemp('ckpt')}/checkpoints"])


def test_every_mesh_gives_the_single_device_losses(mesh_runs):
    single = mesh_runs["runs"]["(1, 1, 1)"]["losses"]
    assert len(single) == STEPS and single[0] > single[-1]  # it trains
    for mesh in MESHES[1:]:
        # Sharded sums and all-reduces add in another order than one device does.
        assert_close(mesh_runs["runs"][mesh]["losses"], single, REORDERED, mesh)


def test_params_are_split_as_the_rules_say(mesh_runs):
    """Query kernel [layers=2, embed=64, heads=4, kv=16]: embed -> fsdp, heads -> tensor (rules fsdp_tp)."""
    kernel = "encoder/stack/layers/attention/query/kernel"
    word = "encoder/embeddings/word/embedding"  # [vocab=128, embed=64]: vocab -> tensor, embed -> fsdp
    shapes = {mesh: mesh_runs["runs"][mesh]["shard_shapes"] for mesh in MESHES}
    assert shapes["(8, 1, 1)"][kernel] == [2, 64, 4, 16]  # data parallel: whole on every device
    assert shapes["(1, 8, 1)"][kernel] == [2, 8, 4, 16]
    assert shapes["(1, 2, 4)"][kernel] == [2, 32, 1, 16]
    assert shapes["(2, 2, 2)"][kernel] == [2, 32, 2, 16]
    assert shapes["(1, 2, 4)"][word] == [32, 32]
    assert shapes["(2, 2, 2)"][word] == [64, 32]


def test_checkpoint_written_under_one_mesh_resumes_under_another(mesh_runs):
    """Saved under (2, 2, 2) after SAVE_AT steps; restored under DP, FSDP and TP meshes."""
    single = mesh_runs["runs"]["(1, 1, 1)"]["losses"]
    assert sorted(mesh_runs["resumed"]) == sorted(MESHES[1:-1])
    for mesh in MESHES[1:-1]:
        resumed = mesh_runs["resumed"][mesh]
        assert resumed["placed_by_new_mesh"], mesh
        assert resumed["data_step"] == SAVE_AT
        assert_close(resumed["losses"], single[SAVE_AT:], REORDERED, mesh)  # trained under other meshes
