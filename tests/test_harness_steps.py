"""The harness's steps, each alone (bert_jax/run/harness.py: `run` is their sequence): a step is a function of what
its signature names, so it runs here on the instruments of a workdir, without a program or a loop."""
import numpy as np
import pytest

from bert_jax.checkpoint import manager as ckpt
from bert_jax.run import goodput, harness
from bert_jax.run.device_memory import DeviceMemory
from bert_jax.run.metrics_file import read_rows
from bert_jax.run.metrics_writer import MetricsWriter
from bert_jax.run.profile_window import ProfileWindow
from bert_jax.run.step_clock import StepClock
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.train.config_validation import check_config
from test_spike import RowHooks, spike_config


class EveryFourth(RowHooks):
    def logs_at(self, step):
        return step % 4 == 0


@pytest.fixture
def instruments(tmp_path):
    """A fresh start's instruments on a workdir, closed as `run` closes them."""
    config = spike_config()
    config.logging.tensorboard = False
    config = check_config(config)
    workdir = str(tmp_path)
    clock = StepClock("startup", goodput.start_origin())
    manager = ckpt.make_manager(paths.absolute(Workdir(workdir).checkpoints), config.checkpoint)
    recorder = goodput.Recorder(workdir, clock, 0, active=True)
    writer = MetricsWriter(workdir, config, -1)
    profile = ProfileWindow(config.train.get("profile"), workdir, 0, config.train.num_steps)
    tools = harness.Instruments(clock=clock, manager=manager, writer=writer, recorder=recorder, profile=profile,
                                memory=DeviceMemory([]), spikes=harness.spikes_for(config, workdir, 0))
    yield tools, config, workdir
    harness.close_run(manager, clock, RowHooks(), None, recorder, writer, profile)


def test_a_step_off_the_log_cadence_keeps_its_metrics_pending_and_writes_only_its_extra(instruments):
    tools, config, workdir = instruments
    marks = harness.Marks(pending=[(3, {"loss": np.float32(2.0), "nonfinite": np.float32(0)})], evaluated=0, saved=0)
    harness.log_step(3, False, {"data/ended": 1.0}, marks, EveryFourth(), tools, config)
    assert len(marks.pending) == 1
    harness.log_step(4, False, {}, marks, EveryFourth(), tools, config)
    assert marks.pending == []
    rows = read_rows(Workdir(workdir).metrics_jsonl)
    assert rows[0] == {"step": 3, "data/ended": 1.0}
    assert rows[1]["step"] == 4 and rows[1]["train/loss"] == 2.0 and rows[1]["train/skipped_steps"] == 0.0


def test_a_save_with_a_spike_pending_is_not_made(instruments):
    """A preemption's save that a spike's rollback did not see coming: the checkpoint before stays the newest."""
    tools, config, _ = instruments
    pending = [(5, {"loss": np.float32(np.inf), "nonfinite": np.float32(1)})]
    marks = harness.Marks(pending=pending, evaluated=4, saved=4)
    harness.save_step(5, None, marks, RowHooks(), tools, harness.Batches(iter(())), config.train.nan_policy)
    assert marks.saved == 4 and tools.manager.latest_step() is None
