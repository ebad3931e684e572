"""A lost host ends the run instead of hanging it (bert_jax/parallel/distributed.py's PeerWatch): the watch's
judgement on a fake coordination service and clock, then two pre-training processes on 127.0.0.1, one SIGKILLed."""
import io
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from bert_jax.parallel import distributed


class FakeService:
    """The coordination service's key-value store as PeerWatch uses it; `down` makes every call fail."""

    def __init__(self):
        self.store, self.down = {}, False

    def key_value_set(self, key, value, allow_overwrite=False):
        if self.down:
            raise RuntimeError("UNAVAILABLE: failed to connect to all addresses")
        self.store[key] = value

    def key_value_try_get(self, key):
        if self.down:
            raise RuntimeError("UNAVAILABLE: failed to connect to all addresses")
        if key not in self.store:
            raise KeyError(key)
        return self.store[key]


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def watches(timeout_s=10.0):
    service, clock = FakeService(), FakeClock()
    return service, clock, [distributed.PeerWatch(service, i, 3, timeout_s, stop=lambda line: None, clock=clock)
                            for i in range(3)]


def test_a_silent_peer_is_named_once_its_timeout_passes_and_only_then():
    _, clock, (w0, w1, w2) = watches()
    for _ in range(3):  # everyone beats for 12 s
        clock.now += 4
        for w in (w0, w1, w2):
            w.beat_once()
        assert w0.lost() is None
    # Process 2 is killed. w0 read its last counter one round late (w0 beats before w2 in each round), at 116.
    for now, expected in ((116, None), (120, None), (124, None), (128, "process 2 of the run is lost: no heartbeat "
                                                                        "for 12 s")):
        clock.now = now
        w0.beat_once()
        w1.beat_once()
        line = w0.lost()
        assert line == expected if expected is None else line.startswith(expected), (now, line)
    assert "config.distributed.heartbeat_timeout_s=10" in line


def test_a_peer_that_ended_normally_is_not_lost():
    service, clock, (w0, w1, w2) = watches()
    for w in (w0, w1, w2):
        w.beat_once()
    for i in (1, 2):  # what their finish() writes first
        service.key_value_set(distributed._KEY.format(i), distributed._DONE, allow_overwrite=True)
    clock.now += 60
    w0.beat_once()
    assert w0.lost() is None and w0.peers == []
    w0.finish(sleep=lambda s: None)  # every peer is done: it returns at once


def test_a_process_ending_by_an_exception_names_the_peer_that_died_before_it_exits():
    """A collective that lost its peer's connection raises; on the way out, finish() waits for the others, so the
    process ends with the line naming the dead one rather than in JAX's shutdown, which waits for it or aborts."""
    service, clock, (w0, w1, w2) = watches()
    stopped = []
    w0.stop = stopped.append
    for w in (w0, w1, w2):
        w.beat_once()
    service.key_value_set(distributed._KEY.format(1), distributed._DONE, allow_overwrite=True)  # 1 ended; 2 died
    w0.finish(sleep=lambda s: setattr(clock, "now", clock.now + s))
    assert len(stopped) == 1 and stopped[0].startswith("process 2 of the run is lost: no heartbeat for 1"), stopped
    assert service.store[distributed._KEY.format(0)] == distributed._DONE


def test_a_coordination_service_that_stops_answering_is_the_coordinator_lost():
    service, clock, (_, w1, _) = watches()
    w1.beat_once()
    service.down = True  # process 0, which serves it, was killed
    clock.now += 11
    w1.beat_once()
    assert w1.lost().startswith("process 0 of the run (the coordinator) is lost: the coordination service has not "
                                "answered for 11 s")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # three two-process pre-trainings (one killed, its relaunch, a straight one) on 2 cores
def test_a_killed_process_ends_its_peer_within_a_minute_and_both_relaunched_resume_exactly(tmp_path):
    from test_pretrain import micro_overrides, train_losses  # noqa: PLC0415

    from bert_jax.launch.local import free_port, process_commands, process_env, run_local  # noqa: PLC0415

    timeout_s = 20
    flags = [*micro_overrides(), "--config.train.num_steps=16", f"--config.distributed.heartbeat_timeout_s={timeout_s}"]

    def command(workdir):
        return [sys.executable, "-m", "bert_jax.commands.pretrain", "--config=configs/tiny.py", f"--workdir={workdir}",
                *flags]

    env = process_env(1)
    env.update(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "xla_cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    out = io.StringIO()
    assert run_local(command(straight), num_processes=2, out=out, timeout_s=1500) == 0, out.getvalue()[-3000:]

    procs = [subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for c in process_commands(command(killed), 2, free_port())]
    logs = {0: [], 1: []}
    reached = threading.Event()

    def read(i):
        for line in procs[i].stdout:
            logs[i].append(line)
            if i == 0 and "step 6/16" in line:
                reached.set()

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in (0, 1)]
    for r in readers:
        r.start()
    assert reached.wait(1200), "".join(logs[0][-30:])
    os.kill(procs[1].pid, signal.SIGKILL)  # a host gone mid-run, between two checkpoints (every 4 steps)
    killed_at = time.monotonic()
    try:
        status = procs[0].wait(timeout=120)
    finally:
        procs[0].kill()
    took = time.monotonic() - killed_at
    readers[0].join(10)
    last = [line for line in logs[0] if line.strip()][-1]
    assert status == distributed.LOST_PEER_STATUS, "".join(logs[0][-30:])
    assert last.startswith("bert-jax: process 1 of the run is lost: no heartbeat for"), last
    assert took < 60, took

    assert run_local(command(killed), num_processes=2, out=out, timeout_s=1500) == 0, out.getvalue()[-3000:]
    assert train_losses(killed) == train_losses(straight)  # bit for bit, the replayed steps included
