"""Sequences/s of the loader at several grain worker counts, A/B/C in one run (config.data.worker_count).

    python bench/loader_workers.py                       # worker_count 0, 1, 2 at seq 128, NSP
    python bench/loader_workers.py --counts=0,1,2,3

Reads bench/loader_throughput.py's prepared corpus at per-host batch 256, token masking, seq 128.
Each round times every count (the order rotated from round to round, so load from others on the
machine falls on all of them) over `--batches` batches after `--warmup`; prints each round, the
median of each count and its ratio to the first. This is the figure behind worker_count=auto
(data_pipelines/loader/workers.py): on a host of n cores, min(8, n - 1) workers.
"""

from __future__ import annotations

import argparse
import os
import statistics

from absl import flags

from bench.loader_throughput import (
    BATCH, _config, _prepared_corpus, add_corpus_arguments, add_round_arguments, timed_round,
)
from data_pipelines.loader import pipeline
from data_pipelines.tokenizers import tokenizer as tokenizer_lib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_arguments(parser)
    parser.add_argument("--counts", default="0,1,2", help="worker counts to compare; the first is the base")
    add_round_arguments(parser)
    args = parser.parse_args()
    flags.FLAGS.mark_as_parsed()  # grain's worker processes read absl flags.

    prepared = _prepared_corpus(args.keep, args.repeat)
    tokenizer = tokenizer_lib.load_tokenizer(os.path.join(prepared, "tokenizer"))
    counts = [int(c) for c in args.counts.split(",")]
    rates: dict[int, list[float]] = {c: [] for c in counts}
    for r in range(args.rounds):
        for count in counts[r % len(counts):] + counts[: r % len(counts)]:
            args.worker_count = count
            per_s, per_cpu_s = timed_round(_config(prepared, 128, 20, "token", args), tokenizer, args)
            rates[count].append(per_s)
            print(f"round {r} workers={count}: {per_s:8.0f} seq/s ({per_cpu_s:.0f} per CPU-second)", flush=True)
    base = statistics.median(rates[counts[0]])
    for count in counts:
        median = statistics.median(rates[count])
        print(f"median workers={count}: {median:.0f} seq/s, {median / base:.2f}x workers={counts[0]} "
              f"(seq 128, batch {BATCH}, builder {args.builder}, prefetch {args.prefetch})")


if __name__ == "__main__":
    main()
