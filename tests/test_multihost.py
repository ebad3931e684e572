"""Multi-host runs on localhost: processes joined by jax.distributed through launch/local.py."""
import io
import json
import os
import re
import sys
import time

import pytest

from bert_jax.launch.local import run_local

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from numerics import REORDERED, assert_close  # noqa: E402
from test_parallel_mesh import FAST_COMPILE, run_parallel_steps  # noqa: E402
from test_pretrain import micro_overrides, read_metrics, train_losses  # noqa: E402

STEPS_SCRIPT = [sys.executable, os.path.join(REPO, "tests", "parallel_steps.py")]
CONTEXT_SCRIPT = [sys.executable, os.path.join(REPO, "tests", "context_steps.py")]


def results(output: str) -> dict:
    line = next(line for line in output.splitlines() if line.startswith("[p0] RESULT "))
    return json.loads(line[len("[p0] RESULT "):])


@pytest.mark.slow  # ~90 s: three processes compile 8-device programs
def test_two_processes_give_the_one_process_losses(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE)  # as for the single-process run
    single = run_parallel_steps(["--meshes=1,1,1", "--steps=3"])
    out = io.StringIO()
    status = run_local([*STEPS_SCRIPT, "--meshes=8,1,1;2,2,2", "--steps=3"], num_processes=2,
                       devices_per_process=4, out=out, timeout_s=600)
    assert status == 0, out.getvalue()[-3000:]
    two = results(out.getvalue())
    assert (two["process_count"], two["device_count"]) == (2, 8)
    for mesh in ("(8, 1, 1)", "(2, 2, 2)"):
        # Collectives across processes (gloo) sum in another order than one device does.
        assert_close(two["runs"][mesh]["losses"], single["runs"]["(1, 1, 1)"]["losses"], REORDERED, mesh)
    # A hybrid mesh: each process counts as a slice, the data axis crosses them (mesh (2,1,1) x (1,2,2)).
    out = io.StringIO()
    status = run_local([*STEPS_SCRIPT, "--meshes=1,2,2", "--dcn_shape=2,1,1", "--steps=3"], num_processes=2,
                       devices_per_process=4, out=out, timeout_s=600)
    assert status == 0, out.getvalue()[-3000:]
    hybrid = results(out.getvalue())["runs"]["(1, 2, 2)"]
    assert hybrid["mesh"] == {"data": 2, "fsdp": 2, "context": 1, "tensor": 2}
    assert_close(hybrid["losses"], single["runs"]["(1, 1, 1)"]["losses"], REORDERED)


@pytest.mark.slow  # ~45 s: two processes compile 2-device programs twice
def test_a_context_axis_across_two_processes_gives_the_one_process_losses(monkeypatch):
    """config.mesh.context=4 on two processes of 2 devices: the mesh (data 1, context 4) has one context group, whose
    devices are both processes', so the global layer's all-gathered keys and values, the local layer's halo and the
    ring's permutes cross between processes (gloo). modernbert_base.py:tiny's packed rows, 3 steps, against one
    process of one device without the axis."""
    monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE)
    args = ["--config", "modernbert", "--steps=3"]
    single = run_parallel_steps([*args, "--context_attention"], env_devices=1, script="context_steps.py")
    out = io.StringIO()
    status = run_local([*CONTEXT_SCRIPT, *args, "--context=4", "--context_attention", "all_gather", "ring"],
                       num_processes=2, devices_per_process=2, out=out, timeout_s=600)
    assert status == 0, out.getvalue()[-3000:]
    two = results(out.getvalue())["modernbert"]["split"]
    whole = single["modernbert"]["losses"]
    assert len(set(whole)) == 3  # each step's update changes the next loss
    assert sorted(two) == ["all_gather", "ring"]
    for scheme, run in two.items():
        assert run["processes"] == 2 and run["mesh"] == {"data": 1, "fsdp": 1, "context": 4, "tensor": 1}
        assert run["context_groups"] == [[0, 1]], scheme  # the axis spans the processes
        assert "context" in run["permutes_over"], scheme
        assert_close(run["context_losses"], whole, REORDERED, scheme)
    assert "context" in two["all_gather"]["attention_gathers_over"]


@pytest.mark.slow  # ~3 min: the tokenizer and the steps' compiles, once on one process and once on two
def test_pretrain_with_a_context_axis_across_two_processes_logs_the_one_process_losses(tmp_path, monkeypatch):
    """`bert-jax pretrain` of modernbert_base.py:tiny (packed rows, a local and a global layer) at
    config.mesh.context=4 on two processes of 2 devices: the context group spans both, which split no rows, so both
    must read the same stream (mesh.host_data_share); before, each read its own half-batch as the whole, and the
    processes logged different losses. 3 steps against one process of one device without the axis."""
    monkeypatch.setenv("XLA_FLAGS", FAST_COMPILE)
    command = [sys.executable, "-m", "bert_jax.commands.pretrain", "--config=configs/modernbert_base.py:tiny",
               "--config.train.num_steps=3", "--config.train.warmup_steps=1", "--config.train.log_every_steps=1",
               "--config.train.eval_every_steps=100",
               "--config.checkpoint.every_steps=100", "--config.model.attention_impl=xla"]
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    out = io.StringIO()
    assert run_local([*command, f"--workdir={one}"], num_processes=1, out=out, timeout_s=600) == 0, \
        out.getvalue()[-3000:]
    out = io.StringIO()
    status = run_local([*command, f"--workdir={two}", "--config.mesh.context=4"], num_processes=2,
                       devices_per_process=2, out=out, timeout_s=600)
    assert status == 0, out.getvalue()[-3000:]
    logged = {p: re.findall(rf"\[p{p}\] .*step \d+/3 \| loss ([\d.]+)", out.getvalue()) for p in (0, 1)}
    assert len(logged[0]) == 3 and logged[0] == logged[1], logged  # both processes train the same batch
    assert "2 local / 4 global devices" in out.getvalue()
    whole = [loss for _, loss in train_losses(one)]
    assert len(whole) == 3 and len(set(whole)) == 3
    assert_close([loss for _, loss in train_losses(two)], whole, REORDERED)


def test_a_dead_process_stops_its_peers_with_an_error():
    """Process 1 exits after joining; process 0, waiting in a collective, fails within the heartbeat timeout (5 s)."""
    out = io.StringIO()
    start = time.monotonic()
    status = run_local([*STEPS_SCRIPT, "--die_process=1"], num_processes=2, out=out, grace_s=60, timeout_s=120)
    elapsed = time.monotonic() - start
    log = out.getvalue()
    assert status != 0 and "[launch.local] killing" not in log, log[-3000:]  # p0 stopped on its own
    assert "process 1 dies now" in log
    assert re.search(r"\[p0\] .*(heartbeat|unavailable|UNAVAILABLE|DEADLINE|disconnected|barrier)", log, re.I), log[-3000:]
    assert elapsed < 60


def test_sigterm_on_one_host_stops_every_host_at_the_same_step():
    out = io.StringIO()
    status = run_local([*STEPS_SCRIPT, "--preempt_process=1"], num_processes=2, out=out, grace_s=30, timeout_s=120)
    log = out.getvalue()
    assert status == 0, log[-3000:]
    stops = sorted(re.findall(r"\[p(\d)\] process \d stops at step (\d+)", log))
    assert len(stops) == 2 and stops[0][1] == stops[1][1] and int(stops[0][1]) >= 3, log[-3000:]


@pytest.mark.slow
def test_pretrain_on_two_processes_checkpoints_collectively_and_logs_once(tmp_path):
    workdir = str(tmp_path / "run")
    out = io.StringIO()
    command = [sys.executable, "-m", "bert_jax.commands.pretrain", "--config=configs/tiny.py", f"--workdir={workdir}",
               *micro_overrides()]
    status = run_local(command, num_processes=2, devices_per_process=1, out=out, timeout_s=900)
    assert status == 0, out.getvalue()[-4000:]
    steps = [r["step"] for r in read_metrics(workdir) if "train/loss" in r]
    assert steps == sorted(set(steps)) and steps[-1] == 8  # one writer: no step logged twice
    saved = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert saved == [4, 8]
    data_files = [f for f in os.listdir(os.path.join(workdir, "checkpoints", "8", "data")) if f.endswith(".json")]
    assert sorted(data_files) == ["process_0-of-2.json", "process_1-of-2.json"]  # each host's iterator
    # Resuming on two processes continues from the collective checkpoint.
    status = run_local(command + ["--config.train.num_steps=10", "--config.accept_changes=train.num_steps"],
                       num_processes=2, out=out, timeout_s=900)
    assert status == 0, out.getvalue()[-4000:]
    assert "starting at step 8 of 10" in out.getvalue()
