"""grain worker processes: how many `auto` runs (and that a run keeps its number), and a worker that dies is
an error naming it, not a hang."""

import glob
import multiprocessing
import os
import pathlib
import signal
import threading
import time

import pytest

from bert_jax.configs import base
from data_pipelines.loader import pipeline, workers
from data_pipelines.tokenizers import tokenizer as tokenizer_lib


# Either of two watchers reports a dead worker: grain's own look (every second, from the thread waiting for the
# batch) or workers.WatchedIterator's (every WATCH_POLL_S without a batch). Which looks first is a race that load
# decides: at a load of 12 on 2 cores grain's thread lost it, and a test that matched grain's words alone failed.
# Both name the exit code; each watcher is made the first here in turn.
DEAD_WORKER = r"orker process.*exit code -9"


@pytest.mark.slow  # worker start-up costs seconds on 2 cores
@pytest.mark.parametrize("first", ["grain", "watch"])
def test_a_killed_worker_is_an_error_within_a_minute(tmp_path, monkeypatch, first):
    if first == "watch":
        monkeypatch.setattr(workers, "WATCH_POLL_S", 0.01)  # looks long before grain's next look (1 s)
    cfg = base.get_config().data
    cfg.vocab_size, cfg.max_seq_length, cfg.tokenizer.sample_bytes = 1024, 64, 200_000
    cfg.worker_count = 2
    tokenizer = tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path / "tokenizer"))
    iterator = pipeline.build_train_iterator(cfg, tokenizer, seed=0, per_host_batch_size=8)
    # Worker w builds batches w, w + 2, ...; grain may start a worker's process only when its first batch is asked
    # for, so the second batch, not the first, proves both run (at a load of 16 the second had not started yet).
    for _ in range(2):
        next(iterator)
    processes = [p for p in multiprocessing.active_children() if p.name.startswith("grain-")]
    assert len(processes) == 2, processes
    os.kill(processes[0].pid, signal.SIGKILL)  # what the kernel's OOM killer does
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=DEAD_WORKER) as raised:
        for _ in range(10_000):
            next(iterator)
    if first == "watch":
        assert "grain worker process(es) died" in str(raised.value)
    assert time.monotonic() - started < 60


def _kill_spawned_workers(stop: threading.Event) -> None:
    """SIGKILLs each child process of this one as soon as it runs multiprocessing's spawn_main: a worker
    that dies as it starts (out of memory, a crash on import)."""
    killed = set()
    while not stop.is_set():
        for children in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
            for pid in map(int, pathlib.Path(children).read_text().split()):
                try:
                    cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"spawn_main" in cmdline and pid not in killed:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
        time.sleep(0.002)


@pytest.mark.slow  # worker start-up costs seconds on 2 cores
def test_workers_killed_as_they_start_are_an_error_within_a_minute(tmp_path):
    """Both workers die before they read their dataset: grain's own check never runs (the spawn blocks
    writing to the pipe), and the trainer waited forever before workers.WatchedIterator."""
    cfg = base.get_config().data
    cfg.vocab_size, cfg.max_seq_length, cfg.tokenizer.sample_bytes = 1024, 64, 200_000
    cfg.worker_count = 2
    tokenizer = tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path / "tokenizer"))
    iterator = pipeline.build_train_iterator(cfg, tokenizer, seed=0, per_host_batch_size=8)
    stop = threading.Event()
    threading.Thread(target=_kill_spawned_workers, args=(stop,), daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"exit code -9"):
            next(iterator)
    finally:
        stop.set()
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("cores, count", [(1, 0), (2, 0), (3, 2), (9, 8), (224, 8)])
def test_auto_leaves_the_trainer_a_core_and_caps_at_eight(cores, count):
    """auto: min(8, cores - 1), and the prefetch thread (0) where that gives a single worker."""
    assert workers.auto_worker_count(cores) == count


@pytest.mark.parametrize("value", [-1, "many", 1.5])
def test_a_bad_worker_count_fails_naming_the_key(value):
    with pytest.raises(ValueError, match=r"config.data.worker_count=.*expected 'auto' or a number >= 0"):
        workers.worker_count(value)


@pytest.mark.slow  # worker processes start in seconds on 2 cores
def test_one_worker_gives_the_batches_of_none(tmp_path):
    """So a host whose `auto` is 0 and one that runs a single worker draw the same batches."""
    cfg = base.get_config().data
    cfg.vocab_size, cfg.max_seq_length, cfg.tokenizer.sample_bytes = 1024, 64, 200_000
    tokenizer = tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path / "tokenizer"))
    digests = []
    for count in (0, 1):
        cfg.worker_count = count
        iterator = pipeline.build_train_iterator(cfg, tokenizer, seed=0, per_host_batch_size=8)
        digests.append(pipeline.batch_digest(next(iterator) for _ in range(6)))
    assert digests[0] == digests[1]


@pytest.mark.slow
def test_a_resume_under_auto_keeps_the_worker_count_the_run_started_with(tmp_path, xla_compile_cache):
    """A run started with 2 workers and relaunched with worker_count=auto (on a host where auto is another
    number) resumes with 2 and its own batches; an explicit other number is refused, naming the key."""
    from test_pretrain import micro_config, train_losses  # noqa: PLC0415

    from bert_jax.run.experiment import ExperimentChangedError  # noqa: PLC0415
    from bert_jax.train.loop import train_and_evaluate  # noqa: PLC0415

    assert workers.auto_worker_count() != 2  # this host's auto differs from the run's number
    two = micro_config()
    two.data.worker_count = 2
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    train_and_evaluate(two, straight)
    train_and_evaluate(two, resumed, stop_at_step=4)
    other = micro_config()
    other.data.worker_count = 0
    with pytest.raises(ExperimentChangedError, match=r"config.data.worker_count: 2 -> 0"):
        train_and_evaluate(other, resumed)
    auto = micro_config()
    auto.data.worker_count = workers.AUTO
    train_and_evaluate(auto, resumed)
    assert train_losses(resumed) == train_losses(straight)


def test_a_run_records_the_number_auto_resolved_to():
    """config.json holds the resolved config: auto becomes this host's number, which a resume then keeps."""
    from bert_jax.train.config_validation import resolve_config  # noqa: PLC0415

    config = base.get_config()
    assert config.data.worker_count == workers.AUTO
    assert resolve_config(config).data.worker_count == workers.auto_worker_count()
    config.data.worker_count = 3
    assert resolve_config(config).data.worker_count == 3
