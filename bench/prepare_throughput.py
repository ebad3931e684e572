"""`prepare` and `prepare_beam` throughput (MB/s of raw text, MB per CPU-second) and peak memory.

    python bench/prepare_throughput.py [--engine=both] [--megabytes=200] [--num_workers=2] \
        [--num_files=16] [--kind=wordpiece] [--keep=/tmp/prepare_bench]

Builds the corpus by repeating the embedded corpus (Python's documentation, ~1.5 MB of
sentences) into `--num_files` text files, one segment per line and a blank line between
documents; trains the tokenizer on a 20 MB sample (timed apart); then times
`bert_jax.commands.prepare.prepare` (`--engine=prepare`) and/or `prepare_beam` on the
DirectRunner with `--num_workers` processes (`--engine=beam`) on the whole corpus, each
with that tokenizer. Each engine ends with one summary line:
`<engine>: X MB per CPU-second, Y MB/s, peak tree RSS Z MiB`.

Memory: the peak of the summed RSS over the whole process tree, sampled every 0.2 s
(psutil). The goal is a tree peak <= 2 GiB whatever the corpus size: each prepare worker
holds one batch of documents and one open shard; a Beam worker holds one shard's records
while it sorts them (corpus / --num_shards 16 here).

CPU-seconds count the process tree (resource.getrusage SELF + CHILDREN): prepare's pool
and Beam's worker processes are waited for before the figure is read.

Repeated text flatters the tokenizer's word cache a little. On shared CPU cores the wall
clock figure depends on what else runs; MB per CPU-second (user + system time of the
process tree) does much less.
"""
from __future__ import annotations

import os
import resource
import shutil
import tempfile
import threading
import time

from absl import app, flags

import bert_jax.configs.base
from data_pipelines.sources import corpus
from data_pipelines.shards import prepare, prepare_beam
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

_MEGABYTES = flags.DEFINE_integer("megabytes", 200, "Corpus size to build, in MB (10^6 bytes).")
_NUM_FILES = flags.DEFINE_integer("num_files", 16, "Text files the corpus is spread over.")
_NUM_WORKERS = flags.DEFINE_integer("num_workers", 2, "prepare's worker processes.")
_KIND = flags.DEFINE_string("kind", "wordpiece", "Tokenizer kind (config.data.tokenizer.kind).")
_ENGINE = flags.DEFINE_enum("engine", "both", ["prepare", "beam", "both"], "Which preparation to time.")
_KEEP = flags.DEFINE_string("keep", "", "Directory to build in and keep; default: a temp dir, removed.")


def build_corpus(directory: str, megabytes: int, num_files: int) -> int:
    """Writes ~megabytes of repeated embedded-corpus documents; returns the bytes written."""
    documents = ["\n".join(d).encode("utf-8") + b"\n\n" for d in corpus.embedded_documents()]
    target, written = megabytes * 10**6, 0
    files = [open(os.path.join(directory, f"part{i:03d}.txt"), "wb") for i in range(num_files)]
    try:
        while written < target:
            for index, document in enumerate(documents):
                files[index % num_files].write(document)
                written += len(document)
                if written >= target:
                    break
    finally:
        for f in files:
            f.close()
    return written


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its finished children."""
    own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class TreeRss:
    """Samples the summed RSS of this process and its descendants; keeps the peak."""

    def __init__(self, interval_s: float = 0.2):
        self.peak_bytes = 0
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        import psutil  # noqa: PLC0415 (bench-only)

        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for process in [me, *me.children(recursive=True)]:
                try:
                    total += process.memory_info().rss
                except psutil.Error:
                    pass  # Exited between listing and reading.
            self.peak_bytes = max(self.peak_bytes, total)
            self._stop.wait(self._interval_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _run_engine(engine: str, data, out: str) -> dict:
    if engine == "prepare":
        return prepare.prepare(data, out, num_workers=_NUM_WORKERS.value, docs_per_shard=10_000)
    options = [f"--direct_num_workers={_NUM_WORKERS.value}", "--direct_running_mode=multi_processing"]
    return prepare_beam.prepare_beam(data, out, options, num_shards=16)


def _time_engine(engine: str, data, size: int, tokenizer_dir: str, out: str) -> None:
    tokenizer_lib.copy_tokenizer(tokenizer_dir, os.path.join(out, prepare.TOKENIZER_DIR))
    cpu_before = _cpu_seconds()
    with TreeRss() as tree:
        started = time.perf_counter()
        manifest = _run_engine(engine, data, out)
        seconds = time.perf_counter() - started
    cpu = _cpu_seconds() - cpu_before
    print(f"{engine}: {size / 1e6:.1f} MB, {manifest['documents']} documents, "
          f"{manifest['tokens'] / 1e6:.1f} M tokens, {len(manifest['shards'])} shards "
          f"in {seconds:.1f} s with {_NUM_WORKERS.value} worker(s) on {os.cpu_count()} CPUs; "
          f"{manifest['tokens'] / seconds / 1e6:.2f} M tokens/s, {cpu:.0f} CPU-s in all")
    print(f"{engine}: {size / 1e6 / cpu:.2f} MB per CPU-second, {size / 1e6 / seconds:.2f} MB/s, "
          f"peak tree RSS {tree.peak_bytes / 2**20:.0f} MiB (sampled; goal <= 2048 MiB)")


def main(argv):
    del argv
    root = _KEEP.value or tempfile.mkdtemp(prefix="prepare_bench_")
    corpus_dir, tokenizer_dir = os.path.join(root, "corpus"), os.path.join(root, "tokenizer")
    os.makedirs(corpus_dir, exist_ok=True)
    try:
        started = time.perf_counter()
        size = build_corpus(corpus_dir, _MEGABYTES.value, _NUM_FILES.value)
        print(f"corpus: {size / 1e6:.1f} MB in {_NUM_FILES.value} files, built in "
              f"{time.perf_counter() - started:.1f} s")

        data = bert_jax.configs.base.get_config().data
        data.source, data.path, data.vocab_size = "text", corpus_dir, 30522
        data.tokenizer.kind = _KIND.value
        data.tokenizer.sample_bytes = 20_000_000
        started = time.perf_counter()
        shutil.rmtree(tokenizer_dir, ignore_errors=True)
        tokenizer_lib.prepare_tokenizer(data, tokenizer_dir)
        print(f"tokenizer ({_KIND.value}, 20 MB sample): {time.perf_counter() - started:.1f} s")
        for engine in ("prepare", "beam") if _ENGINE.value == "both" else (_ENGINE.value,):
            out = os.path.join(root, f"prepared_{engine}")
            shutil.rmtree(out, ignore_errors=True)
            _time_engine(engine, data, size, tokenizer_dir, out)
    finally:
        if not _KEEP.value:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    app.run(main)
