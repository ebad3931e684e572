"""Sequences/s of the loader on a 3-source mixture against one source, A/B in one run.

    python bench/mixture_throughput.py                    # seq 128, NSP, the default settings
    python bench/mixture_throughput.py --worker_count=2   # grain worker processes

Both sides read bench/loader_throughput.py's prepared corpus (the embedded corpus repeated,
WordPiece 8192) at per-host batch 256: side `single` as source=prepared, side `mixture` as
config.data.mixture of three prepared sources over the same shards at 0.7/0.2/0.1 (three
streams with their own seeds and builders, mixed in grain's mix order by mixing.MixIterDataset,
counted per source by the trainer's iterator). The default settings include
config.data.worker_count=auto (0 on a host of 2 cores). Rounds alternate the sides, so load from
others on the machine falls on both; each round times `--batches` batches after `--warmup`.
Prints each round and the median of each side, and mixture / single (the goal of issue 41: >= 0.9).
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

WEIGHTS = {"books": 0.7, "web": 0.2, "wiki": 0.1}


def _side(name: str, prepared: str, args):
    data = _config(prepared, 128, 20, "token", args)
    if name == "mixture":
        data.mixture = {source: dict(source="prepared", path=prepared, weight=w) for source, w in WEIGHTS.items()}
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_corpus_arguments(parser)
    add_round_arguments(parser)
    args = parser.parse_args()
    flags.FLAGS.mark_as_parsed()  # grain's worker processes read absl flags.

    prepared = _prepared_corpus(args.keep, args.repeat)
    tokenizer = tokenizer_lib.load_tokenizer(os.path.join(prepared, "tokenizer"))
    rates: dict[str, list[float]] = {"single": [], "mixture": []}
    cpu_rates: dict[str, list[float]] = {"single": [], "mixture": []}
    for r in range(args.rounds):
        for name in ("single", "mixture") if r % 2 == 0 else ("mixture", "single"):
            per_s, per_cpu_s = timed_round(_side(name, prepared, args), tokenizer, args)
            rates[name].append(per_s)
            cpu_rates[name].append(per_cpu_s)
            print(f"round {r} {name:8s}: {per_s:8.0f} seq/s ({per_cpu_s:.0f} per CPU-second)", flush=True)
    single, mixed = statistics.median(rates["single"]), statistics.median(rates["mixture"])
    cpu_single, cpu_mixed = statistics.median(cpu_rates["single"]), statistics.median(cpu_rates["mixture"])
    print(f"median single {single:.0f} seq/s, mixture {mixed:.0f} seq/s: mixture / single = {mixed / single:.2f}; "
          f"per CPU-second {cpu_single:.0f} and {cpu_mixed:.0f}: {cpu_mixed / cpu_single:.2f} "
          f"(seq 128, batch {BATCH}, workers={args.worker_count}, prefetch={args.prefetch})")


if __name__ == "__main__":
    main()
