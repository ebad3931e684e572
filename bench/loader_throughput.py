"""Sequences/s and RSS of the training loader, from prepared shards to masked batches.

    python bench/loader_throughput.py                      # the three cases of issue 28
    python bench/loader_throughput.py --worker_count=2     # grain worker processes
    python bench/loader_throughput.py --fingerprint_out=ref.json   # digests of the first batches
    python bench/loader_throughput.py --fingerprint_check=ref.json # ... compared with a reference

The corpus is the embedded one repeated `--repeat` times as JSONL, tokenized once by
`python -m bert_jax.commands.prepare`'s code (WordPiece, 8192 ids) into `--keep` (kept between
runs; a temp dir otherwise). Each case times (wall clock, and CPU time of all its processes,
which other load on the machine changes less) `pipeline.build_train_iterator(...,
per_host_batch_size=256)` on source=prepared after `--warmup` batches, and reports the
RSS growth (this process and its grain workers) over the RSS before the iterator was built;
the shards are read with pread, so their page cache is not in it. A fingerprint is the
sha256 of the first `--fingerprint_batches` batches' arrays: run it from another checkout
(PYTHONPATH=/other/checkout) to show that two versions of the loader give identical batches.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import psutil
from absl import flags

from bert_jax.configs import tiny
from data_pipelines.sources import corpus
from data_pipelines.loader import pipeline
from data_pipelines.shards import prepare
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

BATCH = 256
# (name, max_seq_length, max_predictions_per_seq, masking)
CASES = (
    ("seq128_token", 128, 20, "token"),
    ("seq128_whole_word", 128, 20, "whole_word"),
    ("seq512_token", 512, 80, "token"),
)


def _prepared_corpus(keep: str, repeat: int) -> str:
    """A prepared directory of the embedded corpus repeated; reused when `keep` holds one."""
    out = os.path.join(keep, f"prepared_x{repeat}")
    if os.path.exists(os.path.join(out, "manifest.json")):
        return out
    os.makedirs(keep, exist_ok=True)
    text = os.path.join(keep, f"embedded_x{repeat}.jsonl")
    with open(text, "w") as f:
        documents = ["\n".join(d) for d in corpus.embedded_documents()]
        for _ in range(repeat):
            for document in documents:
                f.write(json.dumps({"text": document}) + "\n")
    data = tiny.get_config().data
    data.source, data.path, data.field = "jsonl", text, "text"
    started = time.perf_counter()
    manifest = prepare.prepare(data, out, num_workers=2, docs_per_shard=2000)
    print(f"prepared {manifest['documents']} documents, {manifest['tokens']} tokens in "
          f"{len(manifest['shards'])} shards ({time.perf_counter() - started:.0f} s): {out}")
    return out


def _config(prepared: str, seq: int, predictions: int, masking: str, args) -> object:
    data = tiny.get_config().data
    data.source, data.path = "prepared", prepared
    data.max_seq_length, data.max_predictions_per_seq, data.masking = seq, predictions, masking
    data.example_builder = args.builder
    data.worker_count, data.prefetch_buffer_size = args.worker_count, args.prefetch
    return data


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its live worker processes."""
    process = psutil.Process()
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def add_round_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of timed_round's A/B benches: each round's warm-up and timed batches, the rounds, prefetch."""
    parser.add_argument("--prefetch", type=int, default=2, help="config.data.prefetch_buffer_size (the default)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)


def timed_round(data, tokenizer, args) -> tuple[float, float]:
    """Sequences per second and per CPU-second of a fresh train iterator over `args.batches` batches, after
    `args.warmup` (the A/B benches' round: bench/mixture_throughput.py, bench/loader_workers.py)."""
    iterator = pipeline.build_train_iterator(data, tokenizer, seed=0, per_host_batch_size=BATCH)
    for _ in range(args.warmup):
        next(iterator)
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    for _ in range(args.batches):
        next(iterator)
    elapsed, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_started
    del iterator
    return args.batches * BATCH / elapsed, args.batches * BATCH / cpu


def _rss() -> int:
    process = psutil.Process()
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def _run_case(name: str, data, tokenizer, args) -> dict:
    rss_start = _rss()
    iterator = pipeline.build_train_iterator(data, tokenizer, seed=0, per_host_batch_size=BATCH)
    first = [next(iterator) for _ in range(max(args.warmup, args.fingerprint_batches))]
    rss_peak = _rss()
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    for i in range(args.batches):
        next(iterator)
        if i % 10 == 0:
            rss_peak = max(rss_peak, _rss())
    elapsed, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_started
    rss_peak = max(rss_peak, _rss())
    result = {
        "case": name,
        "seq_per_s": args.batches * BATCH / elapsed,
        "seq_per_cpu_s": args.batches * BATCH / cpu,
        "rss_growth_mib": (rss_peak - rss_start) / 2**20,
        "digest": pipeline.batch_digest(first[: args.fingerprint_batches]),
    }
    del iterator
    return result


def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    """The corpus and loader flags this bench shares with bench/mixture_throughput.py."""
    parser.add_argument("--keep", default=os.path.join(tempfile.gettempdir(), "bert_jax_loader_bench"))
    parser.add_argument("--repeat", type=int, default=4, help="copies of the embedded corpus")
    parser.add_argument("--builder", default="nsp")
    parser.add_argument("--worker_count", default="auto",
                        help="config.data.worker_count: a number, or auto (the default: from the host's cores)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_arguments(parser)
    parser.add_argument("--prefetch", type=int, default=0, help="config.data.prefetch_buffer_size")
    parser.add_argument("--warmup", type=int, default=20, help="batches before timing (workers start, buffers fill)")
    parser.add_argument("--batches", type=int, default=400, help="timed batches: fewer give unsteady figures with workers")
    parser.add_argument("--fingerprint_batches", type=int, default=4)
    parser.add_argument("--fingerprint_out", default="")
    parser.add_argument("--fingerprint_check", default="")
    parser.add_argument("--cases", default=",".join(c[0] for c in CASES))
    args = parser.parse_args()
    flags.FLAGS.mark_as_parsed()  # grain's worker processes read absl flags.

    prepared = _prepared_corpus(args.keep, args.repeat)
    tokenizer = tokenizer_lib.load_tokenizer(os.path.join(prepared, "tokenizer"))
    wanted = args.cases.split(",")
    results = []
    for name, seq, predictions, masking in CASES:
        if name in wanted:
            result = _run_case(name, _config(prepared, seq, predictions, masking, args), tokenizer, args)
            results.append(result)
            print(f"loader {name:18s} builder={args.builder} workers={args.worker_count} "
                  f"prefetch={args.prefetch}: {result['seq_per_s']:8.0f} seq/s "
                  f"({result['seq_per_cpu_s']:.0f} per CPU-second), "
                  f"RSS +{result['rss_growth_mib']:.0f} MiB, digest {result['digest'][:16]}", flush=True)
    digests = {r["case"]: r["digest"] for r in results}
    if args.fingerprint_out:
        with open(args.fingerprint_out, "w") as f:
            json.dump(digests, f, indent=2, sort_keys=True)
    if args.fingerprint_check:
        with open(args.fingerprint_check) as f:
            reference = json.load(f)
        same = {k: reference.get(k) == v for k, v in digests.items()}
        print("fingerprint vs", args.fingerprint_check, ":",
              "IDENTICAL" if all(same.values()) else f"DIFFERENT {same}")


if __name__ == "__main__":
    main()
