"""(slow) A 4-point sweep on a local Ray cluster of two fake one-host v4-8 slices: two points at a time,
each a `ray-tpu` job, and a summary that groups the seeds."""
import json
import os
import subprocess
import sys
import time

import pytest

from test_parallel_mesh import FAST_COMPILE
from test_pretrain import REPO

TPU = "v4-8"  # 4 chips: one host


def _wait_for_nodes(cluster, count: int, env: dict, timeout_s: float = 180) -> None:
    """Until `count` nodes are alive; the count is read from a marked line (Ray's workers print to stdout too)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        out = subprocess.run([sys.executable, "-c", (
            "import ray; ray.init(address=%r, logging_level='ERROR'); "
            "print('NODES=%%d' %% sum(n['Alive'] for n in ray.nodes()))") % cluster.address],
            capture_output=True, text=True, timeout=120, env=env).stdout
        alive = [int(line.split("=")[1]) for line in out.splitlines() if line.startswith("NODES=")]
        if alive and alive[-1] >= count:
            return
        time.sleep(1)
    raise TimeoutError(f"the local Ray cluster did not reach {count} live nodes in {timeout_s} s")


def two_slice_cluster(tmp_path, tmp_path_factory):
    """A local Ray cluster with two one-host TPU slices (their names and head resources), and the env its
    jobs run with; the caller closes it."""
    from ray_cluster import LocalRayCluster  # noqa: PLC0415

    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{FAST_COMPILE} --xla_force_host_platform_device_count=1",
               JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla_cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    cluster = LocalRayCluster(str(tmp_path_factory.mktemp("ray")), env)  # short: Ray's socket paths have a limit
    try:
        for nodes, name in enumerate(("slice-a", "slice-b"), 2):  # a one-host TPU VM: its name and the head resource
            cluster.hosts.append(cluster._start([f"--address={cluster.address}", "--num-cpus=1",
                                                 f"--resources={json.dumps({name: 1, f'TPU-{TPU}-head': 1})}"],
                                                {"TPU_NAME": name}))
            _wait_for_nodes(cluster, nodes, env)  # one at a time: two nodes starting together can collide
    except BaseException:
        cluster.close()
        raise
    return cluster, env


@pytest.mark.slow  # a Ray cluster of three nodes and four micro pre-trainings, two at a time: ~3 min on 2 cores
def test_a_four_point_sweep_runs_two_at_a_time_on_two_slices_and_groups_its_seeds(tmp_path, tmp_path_factory):
    cluster, env = two_slice_cluster(tmp_path, tmp_path_factory)
    try:
        overrides = {"model.vocab_size": 1024, "model.hidden_size": 32, "model.num_heads": 2,
                     "model.intermediate_size": 64, "data.max_seq_length": 64, "data.num_eval_batches": 1,
                     "train.global_batch_size": 8, "train.num_steps": 4, "train.warmup_steps": 1,
                     "train.log_every_steps": 1, "train.eval_every_steps": 4, "checkpoint.every_steps": 4,
                     "logging.peak_flops_per_device": 1e11, "logging.tensorboard": False, "logging.plots": False}
        sweep_file = tmp_path / "lr_seeds.py"
        sweep_file.write_text("def get_sweep():\n"
                              f"    return dict(config='configs/tiny.py', overrides={overrides!r},\n"
                              "                grid={'train.learning_rate': [1e-3, 3e-3], 'seed': [0, 1]})\n")
        sweep_dir = tmp_path / "sweep"
        run = subprocess.run([sys.executable, "-m", "bert_jax.commands.sweep", "run", f"--sweep={sweep_file}",
                              f"--sweep_dir={sweep_dir}", "--executor=ray", f"--address={cluster.address}",
                              f"--tpu={TPU}", f"--python={sys.executable}", "--max_wait=600"],
                             cwd=REPO, capture_output=True, text=True, env=env, timeout=1200)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    finally:
        cluster.close()
    summary = subprocess.run([sys.executable, "-m", "bert_jax.commands.sweep", "summary", f"--sweep_dir={sweep_dir}"],
                             cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert summary.count("| done | 4 |") == 4
    assert "| learning_rate=0.001 | 2 |" in summary and "| learning_rate=0.003 | 2 |" in summary  # seeds grouped
    slices = set()
    for log in (sweep_dir / "logs").iterdir():
        slices |= {s for s in ("slice-a", "slice-b") if s in log.read_text()}
    assert slices == {"slice-a", "slice-b"}  # the points ran on both slices
