"""One live run per workdir (bert_jax/run/lease.py), on local disk and in emulated buckets.

The end-to-end case (a second `pretrain` on a running one's workdir stops before step 0)
is in test_preemption.py, beside the running pretrain it needs.
"""
import json

import pytest

from bert_jax.storage import paths
from bert_jax.run import lease as lease_lib


def fast_config(**overrides):
    c = lease_lib.default_config()
    c.heartbeat_s, c.timeout_s, c.settle_s = 0.2, 2.0, 0.05
    c.update(overrides)
    return c


class FakeClock(lease_lib.Clock):
    """A clock that moves only when told (or slept on): a heartbeat's age is what the test set, however long the
    machine took to write and read the lease back (at a load of 12 on 2 cores, seconds)."""

    def __init__(self, now: float = 1_800_000_000.0):
        super().__init__(lambda: self.now, self.advance)
        self.now = now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def other_holder(workdir, age_s: float, clock: FakeClock) -> dict:
    """A lease record of another process on another host, its heartbeat `age_s` old by `clock`."""
    now = clock.time()
    record = {"run_id": "0ther", "host": "tpu-worker-7", "pid": 4242, "started_at": now - 3600,
              "heartbeat": now - age_s, "process_count": 4}
    paths.write_atomically(paths.path(workdir) / "LEASE", json.dumps(record))
    return record


@pytest.fixture(params=["local", "gs", "s3"])
def workdir(request, tmp_path):
    if request.param == "local":
        return str(tmp_path)
    return f"{request.getfixturevalue('gcs' if request.param == 'gs' else 's3').new()}/run"


def test_a_live_lease_of_another_run_refuses_naming_the_holder_and_is_left_alone(workdir):
    clock = FakeClock()
    held = other_holder(workdir, age_s=0.5, clock=clock)
    with pytest.raises(lease_lib.LeaseHeldError, match=r"host tpu-worker-7, pid 4242, started"):
        lease_lib.acquire(workdir, fast_config(), process_index=0, process_count=1, clock=clock)
    assert lease_lib.read_lease(workdir) == held


def test_a_stale_lease_is_taken_over_with_a_warning_then_heartbeats_and_is_released(workdir, caplog):
    clock = FakeClock()
    other_holder(workdir, age_s=10, clock=clock)
    lease = lease_lib.acquire(workdir, fast_config(), process_index=0, process_count=2, clock=clock)
    try:
        assert "taking over the stale lease" in caplog.text and "pid 4242" in caplog.text
        first = lease_lib.read_lease(workdir)
        assert first["run_id"] == lease.record["run_id"] and first["process_count"] == 2
        clock.advance(30)  # past timeout_s: only a heartbeat written since keeps it live
        assert not lease_lib.lease_is_live(first, timeout_s=2.0, now=clock.time())
        # Two more beats of the thread: the second began after the clock moved (the timeout only guards a hang).
        assert lease.wait_for_beats(lease.beats + 2, timeout_s=120)
        beaten = lease_lib.read_lease(workdir)
        assert beaten["heartbeat"] == clock.time() and beaten["run_id"] == lease.record["run_id"]
        assert lease_lib.lease_is_live(beaten, timeout_s=2.0, now=clock.time())
        lease.check()
    finally:
        lease.release()
    assert lease_lib.read_lease(workdir) is None


def test_a_run_whose_lease_was_taken_over_stops(tmp_path):
    """The heartbeat that finds another run's record stops the run. The thread is kept from beating (an hour's
    interval) and the test beats itself: a beat of the thread between the test's write and its own read-back would
    rewrite our record over the other one, which a real taker's settle read-back catches (it then does not start)."""
    clock = FakeClock()
    lease = lease_lib.acquire(str(tmp_path), fast_config(heartbeat_s=3600), process_index=0, process_count=1,
                              clock=clock)
    try:
        assert lease.beat() and lease.lost is None
        other_holder(tmp_path, age_s=0, clock=clock)
        assert not lease.beat()
        with pytest.raises(lease_lib.LeaseLostError, match=r"taken over by run 0ther on host tpu-worker-7"):
            lease.check()
    finally:
        lease.release()
    assert lease_lib.read_lease(tmp_path)["run_id"] == "0ther"  # the new holder's lease is not deleted


def test_waiting_for_a_live_holder_that_ends_then_taking_it(tmp_path):
    """Live for another 0.5 s of timeout_s=2: a wait shorter than that refuses, a longer one takes it once stale, at
    the first look past 0.5 s (looks come every heartbeat_s)."""
    clock = FakeClock()
    other_holder(tmp_path, age_s=1.5, clock=clock)
    with pytest.raises(lease_lib.LeaseHeldError, match="in use by another live run"):
        lease_lib.acquire(str(tmp_path), fast_config(wait_s=0.3), process_index=0, process_count=1, clock=clock)
    clock = FakeClock()
    other_holder(tmp_path, age_s=1.5, clock=clock)
    t0 = clock.time()
    lease = lease_lib.acquire(str(tmp_path), fast_config(wait_s=5.0), process_index=0, process_count=1, clock=clock)
    lease.release()
    config = fast_config()
    assert 0.5 <= clock.time() - t0 <= 0.5 + config.heartbeat_s + config.settle_s + 1e-9


def test_other_hosts_join_without_writing(tmp_path):
    joined = lease_lib.acquire(str(tmp_path), fast_config(), process_index=1, process_count=2)
    joined.check()
    assert lease_lib.read_lease(tmp_path) is None


def test_the_lease_of_a_killed_process_on_this_host_is_stale_at_once(tmp_path):
    import socket
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = other_holder(tmp_path, age_s=0, clock=lease_lib.WALL_CLOCK)
    record.update(host=socket.gethostname(), pid=int(dead.stdout))
    paths.write_atomically(tmp_path / "LEASE", json.dumps(record))
    assert not lease_lib.lease_is_live(record, timeout_s=60)
    lease_lib.acquire(str(tmp_path), fast_config(timeout_s=60), process_index=0, process_count=1).release()
