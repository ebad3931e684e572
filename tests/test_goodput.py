"""A run's goodput across its starts (bert_jax/run/goodput.py) and the profiler window's plan (run/profile_window.py).

The straight run's own goodput, time split and trace are checked in tests/test_pretrain.py, on its fixture."""
import json
import logging
import re
import signal
import subprocess
import sys
import time

import jax
import ml_collections
import pytest

from bert_jax.run import device_memory, goodput, harness, profile_window, step_clock
from bert_jax.launch import sweep
from bert_jax.storage.workdir import Workdir
from test_pretrain import REPO, micro_overrides, read_metrics


def start(started_at, start_step, step, recorded_at, step_seconds, saves=None, **seconds):
    """A start's record as the harness writes it: step time split between dispatch and the device."""
    return goodput.StartRecord(
        started_at=started_at, start_step=start_step, step=step, recorded_at=recorded_at,
        seconds={"dispatch": step_seconds / 2, "device": step_seconds / 2, **seconds},
        step_seconds_at_save={str(k): v for k, v in (saves or {}).items()})


def test_steps_trained_after_the_restored_checkpoint_are_replayed_and_the_gap_is_between_starts(tmp_path):
    # Killed after step 7 (its last record), saved at 4; relaunched 5 s later, it restores step 4 and trains to 10.
    killed = start(100.0, 0, 7, 120.0, 7.0, saves={4: 4.0}, startup=3.0, compile=2.0, checkpoint=1.0, other=7.0)
    resumed = start(125.0, 4, 10, 140.0, 6.0, restore=2.0, compile=2.0, other=5.0)
    goodput.write(str(tmp_path), killed)
    assert goodput.steps_replayed(str(tmp_path), 4) == 3  # what the resume, restoring step 4, trains again
    goodput.write(str(tmp_path), resumed)
    result = goodput.account(goodput.read(str(tmp_path)))
    assert result.starts == 2 and result.replayed_steps == 3
    assert result.seconds["replayed"] == pytest.approx(3.0)  # steps 5 to 7: 7 s of step time less 4 s at the save
    assert result.seconds["productive"] == pytest.approx(4.0 + 6.0)
    assert result.seconds["between_starts"] == pytest.approx(5.0)
    assert result.wall_s == pytest.approx(40.0) == pytest.approx(sum(result.seconds.values()))
    assert result.goodput == pytest.approx(10.0 / 40.0)
    assert goodput.report(str(tmp_path))[-1] == "goodput 25.0 %"


@pytest.mark.slow  # summarize draws curves.png (seconds of matplotlib on 2 cores): the default suite's budget
def test_sweep_summary_shows_each_runs_goodput_beside_its_state(tmp_path):
    for name in ("lr=1", "lr=2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(json.dumps({"step": 8, "eval/loss": 6.0}) + "\n")
    goodput.write(str(tmp_path / "lr=1"), start(0.0, 0, 8, 20.0, 15.0, startup=5.0))
    (tmp_path / "sweep.json").write_text(json.dumps({"summary_keys": ["eval/loss"],
                                                    "runs": [{"name": "lr=1"}, {"name": "lr=2"}]}))
    table = sweep.summarize(str(tmp_path))
    assert [row["goodput"] for row in table] == ["75.0 %", None]  # lr=2 kept no records (a run of older code)
    summary_md = (tmp_path / "summary.md").read_text()
    assert "| run | state | step | goodput |" in summary_md and "| lr=1 | running | 8 | 75.0 % |" in summary_md


def test_a_start_that_never_saved_replays_all_its_steps():
    first = start(0.0, 0, 8, 10.0, 8.0, saves={4: 4.0})
    lost = start(11.0, 4, 6, 20.0, 2.0)  # died before its first save: the next start restores step 4 again
    again = start(21.0, 4, 8, 30.0, 4.0)
    result = goodput.account([first, lost, again])
    assert result.replayed_steps == 4 + 2  # the first start's steps 5-8, the second's 5-6
    assert result.seconds["replayed"] == pytest.approx(4.0 + 2.0)
    assert result.seconds["productive"] == pytest.approx(4.0 + 4.0)


def test_a_profiler_window_past_the_runs_end_is_refused_naming_the_keys():
    window = ml_collections.ConfigDict(dict(start_step=995, num_steps=10, hosts="first"))
    with pytest.raises(ValueError, match=r"config.train.profile.start_step=995 with num_steps=10 traces to step "
                                         r"1004, past the run's last step 1000: start it by step 991"):
        profile_window.check(window, 1000)
    window.start_step, window.hosts = 5, "some"
    with pytest.raises(ValueError, match=r"config.train.profile.hosts='some'; expected one of \('first', 'all'\)"):
        profile_window.check(window, 1000)


def test_a_window_mostly_spent_waiting_for_data_is_said_to_be_held_back_by_the_input_pipeline():
    clock = step_clock.StepClock("other")
    for _ in range(2):  # two steps: a slow batch, a quick dispatch
        with clock.timing("data_wait"):
            time.sleep(0.03)
        with clock.timing("dispatch"):
            time.sleep(0.005)
    row, share = clock.window_row(2)
    assert row["time/data_wait_s"] == pytest.approx(0.03, abs=0.02) and row["time/checkpoint_s"] == 0
    assert share > step_clock.DATA_BOUND_SHARE
    config = ml_collections.ConfigDict({"data": {"worker_count": 2}})
    line = harness.data_bound_line(config, 100, share)
    assert "config.data.worker_count, now 2" in line and "bert-jax prepare" in line
    assert clock.window_row(1)[1] < step_clock.DATA_BOUND_SHARE  # a new window: nothing waited since


def test_the_cpu_keeps_no_allocator_statistics_and_says_so_once(caplog):
    with caplog.at_level(logging.INFO):
        memory = device_memory.DeviceMemory(jax.local_devices())
        assert memory.measure(1) == {} and memory.measure(2) == {}
    assert not memory.measurable
    assert sum("device memory is not measured on cpu" in r.getMessage() for r in caplog.records) == 1


def _pretrain(workdir, *extra):
    return subprocess.Popen([sys.executable, "-m", "bert_jax.pretrain", "--config=configs/tiny.py",
                             f"--workdir={workdir}", *micro_overrides(), *extra],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # two pre-training processes, one killed
def test_a_killed_and_resumed_run_counts_its_replayed_steps_and_its_parts_sum_to_its_wall_time(tmp_path):
    workdir = tmp_path / "run"
    extra = ["--config.train.num_steps=60", "--config.checkpoint.every_steps=5", "--config.train.eval_every_steps=60"]
    killed = _pretrain(workdir, *extra)

    def past_a_committed_save() -> bool:  # a save is asynchronous: killed before its commit, it restores nothing
        saved = Workdir(workdir).checkpoint_steps()
        logged = read_metrics(workdir) if (workdir / "metrics.jsonl").exists() else []
        return bool(saved) and any(r["step"] >= saved[-1] + 2 for r in logged)

    while killed.poll() is None and not past_a_committed_save():
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)  # no save, no last record: a lost host
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    (record,) = goodput.read(str(workdir))
    restored = Workdir(workdir).checkpoint_steps()[-1]
    assert record.step >= restored + 2 and restored % 5 == 0

    resumed = _pretrain(workdir, *extra)
    assert resumed.wait() == 0, resumed.stderr.read()[-3000:]
    first, second = goodput.read(str(workdir))
    assert second.start_step == restored and second.step == 60
    result = goodput.account([first, second])
    assert result.replayed_steps == record.step - restored  # trained by the killed start, and again
    assert result.seconds["replayed"] > 0 or result.replayed_steps == 0
    assert result.seconds["between_starts"] > 0  # the kill, the relaunch
    assert abs(sum(result.seconds.values()) - result.wall_s) <= 0.01 * result.wall_s
    rows = [r for r in read_metrics(workdir) if "train/loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 61))
    assert all({"time/data_wait_s", "time/dispatch_s", "time/device_s", "time/checkpoint_s"} <= set(r) for r in rows)

    shown = subprocess.run([sys.executable, "-m", "bert_jax.commands.inspect", f"--from={workdir}", "--mode=goodput"],
                           cwd=REPO, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr[-3000:]
    lines = shown.stdout.splitlines()
    assert re.fullmatch(r"goodput \d+\.\d %", lines[-1]) and lines[-1] == f"goodput {100 * result.goodput:.1f} %"
    assert any(f"replayed steps ({result.replayed_steps})" in line for line in lines)
    assert json.loads((Workdir(workdir).goodput / second.name).read_text())["start_step"] == restored
