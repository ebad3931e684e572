"""launch.ray_tpu: the relaunch decisions, bad input, and (slow) real runs on a local Ray cluster.

The slow tests run a 2-host tiny pre-training through the launcher on a fake `v4-16` slice
(tests/ray_cluster.py) with its workdir in the emulated gs:// bucket, and make a host
vanish (SIGKILL) or preempt it (SIGTERM) mid-run.
"""
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.run.completion import read_done, write_done
from bert_jax.run.metrics_file import read_rows
from bert_jax.launch import attempts
from bert_jax.launch.attempts import Attempt
from test_parallel_mesh import FAST_COMPILE
from test_pretrain import REPO, micro_overrides


def history(*outcomes):
    """Attempts ending in `outcomes`, each (outcome, step reached)."""
    return [Attempt(i + 1, 0.0, 1.0, outcome, step, "") for i, (outcome, step) in enumerate(outcomes)]


def test_which_outcomes_relaunch():
    assert attempts.decide(history(("done", 8)), 3, 0) == (False, "finished at step 8")
    assert attempts.decide(history(("preempted", 4)), 3, 0)[0]
    assert attempts.decide(history(("preempted", 4), ("preempted", 6), ("preempted", 6)), 3, 0)[0]
    gave_up = attempts.decide(history(("preempted", 4), ("preempted", 6)), 1, 0)
    assert not gave_up[0] and "after 2 preemptions" in gave_up[1] and "at step 6" in gave_up[1]
    # A crash is not retried blindly: only within --max_failures, and only after progress.
    assert not attempts.decide(history(("crashed", 0)), 3, 0)[0]
    assert attempts.decide(history(("crashed", 0)), 3, 1)[0]
    assert attempts.decide(history(("crashed", 2), ("preempted", 5), ("crashed", 7)), 3, 2)[0]
    assert not attempts.decide(history(("crashed", 4), ("crashed", 4)), 3, 5)[0]
    assert not attempts.decide(history(("no_capacity", 0)), 3, 3)[0]


def test_how_an_attempt_ended():
    assert attempts.classify([0, 0], "", done=True)[0] == "done"
    assert attempts.classify([0, None], "host 1 was lost (NodeDiedError)", done=False) == \
        ("preempted", "host 1 was lost (NodeDiedError)")
    assert attempts.classify([0, 0], "", done=False)[0] == "preempted"  # SIGTERM: saved, exit 0, no DONE
    assert attempts.classify([-9, 1], "", done=False)[0] == "preempted"
    assert attempts.classify([1, 0], "", done=False) == ("crashed", "host 0's process exited with status 1")


def test_attempts_round_trip_through_the_workdir(tmp_path):
    runs = history(("preempted", 4), ("done", 8))
    attempts.write_attempts(str(tmp_path), runs)
    assert attempts.read_attempts(str(tmp_path)) == runs
    assert len((tmp_path / "attempts.jsonl").read_text().splitlines()) == 2


def launcher(*flags, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "launch.ray_tpu", *flags], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_bad_input_fails_before_anything_starts(tmp_path):
    local = launcher("--address=127.0.0.1:1", "--tpu=v4-32", "--config=configs/tiny.py", f"--workdir={tmp_path}")
    assert local.returncode != 0 and "a 4-host slice has 4 disks" in local.stderr
    t0 = time.time()
    nobody = launcher("--address=127.0.0.1:1", "--tpu=v4-8", "--config=configs/tiny.py", f"--workdir={tmp_path}")
    assert nobody.returncode != 0 and "--address=127.0.0.1:1: no Ray cluster answers there" in nobody.stderr
    assert time.time() - t0 < 15 + 10
    unknown = launcher("--address=127.0.0.1:1", "--tpu=v9-8", "--config=configs/tiny.py", f"--workdir={tmp_path}")
    assert unknown.returncode != 0 and "Known:" in unknown.stderr
    write_done(tmp_path, 8, 8, "pretrain")
    finished = launcher("--address=127.0.0.1:1", "--tpu=v4-8", "--config=configs/tiny.py", f"--workdir={tmp_path}")
    assert finished.returncode == 0 and "already holds a finished run (DONE: step 8 of 8)" in finished.stdout


def test_the_cluster_yaml_passes_rays_own_validation():
    import yaml
    from ray.autoscaler._private.util import prepare_config, validate_config

    with open(os.path.join(REPO, "launch", "ray_tpu_cluster.yaml")) as f:
        config = prepare_config(yaml.safe_load(f))  # what `ray up` does: fill defaults, then validate
    validate_config(config)  # raises on a schema error
    tpu_types = {name: t for name, t in config["available_node_types"].items() if "acceleratorType" in
                 t.get("node_config", {})}
    assert tpu_types and all(t["node_config"]["schedulingConfig"]["preemptible"] for t in tpu_types.values())
    assert all(t["min_workers"] >= 1 for t in tpu_types.values())  # the autoscaler recreates a lost slice
    assert any("jax[tpu]" in c for c in config["setup_commands"])


# Slow: a real cluster and real 2-host runs.


@pytest.fixture(scope="module")
def cluster(gcs, tmp_path_factory):
    from ray_cluster import LocalRayCluster

    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{FAST_COMPILE} --xla_force_host_platform_device_count=1",
               JAX_COMPILATION_CACHE_DIR=str(tmp_path_factory.mktemp("xla_cache")),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    c = LocalRayCluster(str(tmp_path_factory.mktemp("ray")), env)
    c.start_slice()
    yield c
    c.close()


def run_flags(workdir, *extra):
    return ["--tpu=v4-16", "--config=configs/tiny.py", f"--workdir={workdir}", f"--python={sys.executable}", *extra,
            "--", *micro_overrides(), "--config.train.num_steps=200", "--config.checkpoint.every_steps=4",
            "--config.train.eval_every_steps=200", "--config.distributed.heartbeat_timeout_s=20",
            "--config.lease.timeout_s=20"]


class Launch:
    """The launcher in a subprocess, its output read as it comes (a full pipe would block it)."""

    def __init__(self, cluster, workdir, *extra):
        self.proc = subprocess.Popen([sys.executable, "-m", "launch.ray_tpu", f"--address={cluster.address}",
                                      *run_flags(workdir, *extra)], cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def poll(self):
        return self.proc.poll()

    def communicate(self, timeout):
        self.proc.wait(timeout=timeout)
        self.reader.join(timeout=30)
        return "".join(self.lines), None

    @property
    def returncode(self):
        return self.proc.returncode


def start(cluster, workdir, *extra):
    return Launch(cluster, workdir, *extra)


def losses(workdir):
    return [(r["step"], r["train/loss"]) for r in read_rows(paths.path(workdir) / "metrics.jsonl") if "train/loss" in r]


def wait_for_checkpoint(workdir, step, proc, timeout_s=300):
    deadline = time.time() + timeout_s
    while not any(s >= step for s in Workdir(workdir).checkpoint_steps()):
        assert proc.poll() is None and time.time() < deadline, \
            f"the run ended or stalled before the kill: {''.join(proc.lines)[-3000:]}"
        time.sleep(0.5)


def pretrain_processes():
    return [p for p in psutil.process_iter(["cmdline"]) if "bert_jax.commands.pretrain" in " ".join(p.info["cmdline"] or [])]


@pytest.fixture(scope="module")
def straight(cluster, gcs):
    workdir = f"{gcs.new()}/straight"
    proc = start(cluster, workdir)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:]
    assert "[host 0]" in out  # host 0's output is streamed
    assert [a.outcome for a in attempts.read_attempts(workdir)] == ["done"]
    return losses(workdir)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigkill_host", "sigterm"])
def test_a_preempted_run_is_relaunched_and_ends_with_the_straight_losses(how, cluster, gcs, straight):
    workdir = f"{gcs.new()}/{how}"
    proc = start(cluster, workdir)
    wait_for_checkpoint(workdir, 4, proc)
    if how == "sigkill_host":
        cluster.kill(cluster.hosts[-1])  # host 1 vanishes: raylet, workers, its pretrain
        cluster.add_host(head=False)  # the autoscaler's fresh VM
    else:
        for p in pretrain_processes():
            p.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-6000:]
    runs = attempts.read_attempts(workdir)
    assert [a.outcome for a in runs] == ["preempted", "done"], out[-6000:]
    assert runs[0].step_reached >= 4 and read_done(workdir)["step"] == 200
    assert losses(workdir) == straight  # bit for bit
    assert "attempt 2:" in out and "preempted at step" in out


@pytest.mark.slow
def test_a_config_error_is_not_retried(cluster, gcs):
    workdir = f"{gcs.new()}/bad"
    proc = subprocess.run([sys.executable, "-m", "launch.ray_tpu", f"--address={cluster.address}",
                           *run_flags(workdir), "--config.model.num_heads=3"], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode != 0
    assert "num_heads" in proc.stdout  # the error itself, from host 0's output
    assert [a.outcome for a in attempts.read_attempts(workdir)] == ["crashed"]


@pytest.mark.slow
def test_max_preemptions_gives_up_naming_the_step(cluster, gcs):
    workdir = f"{gcs.new()}/give_up"
    proc = start(cluster, workdir, "--max_preemptions=1")
    wait_for_checkpoint(workdir, 4, proc)
    for p in pretrain_processes():
        p.send_signal(signal.SIGTERM)
    deadline = time.time() + 300
    while not attempts.read_attempts(workdir) and time.time() < deadline:
        time.sleep(0.5)
    wait_for_checkpoint(workdir, attempts.read_attempts(workdir)[0].step_reached + 4, proc)  # the relaunch's
    for p in pretrain_processes():
        p.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 1, out[-4000:]
    runs = attempts.read_attempts(workdir)
    assert [a.outcome for a in runs] == ["preempted", "preempted"]
    assert f"gave up after 2 preemptions (--max_preemptions=1) at step {runs[-1].step_reached}" in out


@pytest.mark.slow
def test_a_tpu_type_the_cluster_never_offers_reports_its_resources(cluster, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launch.ray_tpu", f"--address={cluster.address}", "--tpu=v5p-8",
                           "--config=configs/tiny.py", f"--workdir={tmp_path}", "--max_wait=3"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "no TPU-v5p-8-head within --max_wait=3 s; cluster resources:" in proc.stdout
    assert "fake-slice" in proc.stdout
