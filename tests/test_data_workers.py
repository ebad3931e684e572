"""A grain worker process that dies ends the loader with an error naming it, not a hang."""

import multiprocessing
import os
import signal
import time

import pytest

from configs import base
from data_pipelines.loader import pipeline
from data_pipelines.tokenizers import tokenizer as tokenizer_lib


@pytest.mark.slow  # worker start-up costs seconds on 2 cores
def test_a_killed_worker_is_an_error_within_a_minute(tmp_path):
    cfg = base.get_config().data.copy_and_resolve_references()
    cfg.vocab_size, cfg.max_seq_length, cfg.tokenizer.sample_bytes = 1024, 64, 200_000
    cfg.worker_count = 2
    tokenizer = tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path / "tokenizer"))
    iterator = pipeline.build_train_iterator(cfg, tokenizer, seed=0, per_host_batch_size=8)
    next(iterator)
    workers = [p for p in multiprocessing.active_children() if p.name.startswith("grain-")]
    assert len(workers) == 2, workers
    os.kill(workers[0].pid, signal.SIGKILL)  # what the kernel's OOM killer does
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="Worker process was terminated unexpectedly with exit code -9"):
        for _ in range(10_000):
            next(iterator)
    assert time.monotonic() - started < 60
