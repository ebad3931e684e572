"""Training steps fed by the loader vs fed by a synthetic batch, A/B interleaved in one process.

    python bench/loader_end_to_end.py [--config=configs/tiny.py] [--rounds=10] [--steps=10]

Both sides run the training loop's own line (bert_jax/run/harness.py):
`state, metrics = train_step(state, global_batch(next(batches), data_sharding))`, so JAX's
asynchronous dispatch overlaps the next batch's loading with the current step, as in a run.
A: `batches` is `pipeline.build_train_iterator` over prepared shards (the embedded corpus
repeated, prepared once into --keep, as bench/loader_throughput.py does), with the config's
prefetch and worker settings. B: `batches` repeats one batch the loader made (same shapes,
dtypes and contents), so B costs only the step and the host-to-device copy. Blocks of
--steps steps alternate A, B, A, B...; each block ends with block_until_ready. The ratio of
median step times A / B is the loader's cost to training: the goal is <= 1.03.
"""

from __future__ import annotations

import itertools
import os
import statistics
import sys
import tempfile
import time

import flax.linen as nn
import jax
from absl import app, flags
from ml_collections import config_flags

from bert_jax.parallel.mesh import global_batch, make_mesh
from bert_jax.train.program import build_program
from data_pipelines.loader import pipeline
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

sys.path.insert(0, os.path.dirname(__file__))
from loader_throughput import _prepared_corpus  # noqa: E402 (the same bench corpus)

_CONFIG = config_flags.DEFINE_config_file("config", "configs/tiny.py", "The run's config (tiny: CPU).")
_KEEP = flags.DEFINE_string("keep", os.path.join(tempfile.gettempdir(), "bert_jax_loader_bench"),
                            "Where the prepared bench corpus is kept between runs.")
_REPEAT = flags.DEFINE_integer("repeat", 4, "Copies of the embedded corpus in the bench corpus.")
_ROUNDS = flags.DEFINE_integer("rounds", 10, "A/B rounds.")
_WARMUP = flags.DEFINE_integer("warmup", 40, "Loader batches read before timing.")
_STEPS = flags.DEFINE_integer("steps", 10, "Steps per block.")


def _block(program, state, frozen, batches, steps: int):
    started = time.perf_counter()
    for _ in range(steps):
        state, metrics = program.train_step(state, global_batch(next(batches), program.data_sharding), frozen)
    jax.block_until_ready((state, metrics))
    return state, (time.perf_counter() - started) / steps


def main(_):
    c = _CONFIG.value
    prepared = _prepared_corpus(_KEEP.value, _REPEAT.value)
    c.data.source, c.data.path = "prepared", prepared
    tokenizer = tokenizer_lib.load_tokenizer(os.path.join(prepared, "tokenizer"))
    program = build_program(c, make_mesh(c.mesh))
    loader = pipeline.build_train_iterator(c.data, tokenizer, seed=c.seed,
                                           per_host_batch_size=c.train.global_batch_size)
    synthetic = itertools.repeat(next(loader))
    for _ in range(_WARMUP.value):  # Past the first shuffle window and the prefetch thread's start.
        next(loader)
    times = {"loader": [], "synthetic": []}
    with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules):
        state = program.init()
        frozen = program.load_frozen()
        state, _ = _block(program, state, frozen, synthetic, 2)  # Compiles.
        for _ in range(_ROUNDS.value):
            for name, batches in (("loader", loader), ("synthetic", synthetic)):
                state, step_s = _block(program, state, frozen, batches, _STEPS.value)
                times[name].append(step_s)
    a, b = statistics.median(times["loader"]), statistics.median(times["synthetic"])
    print(f"end to end ({c.train.global_batch_size} x {c.data.max_seq_length}, workers={c.data.worker_count}, "
          f"prefetch={c.data.prefetch_buffer_size}): loader-fed {a * 1e3:.1f} ms/step, synthetic {b * 1e3:.1f} "
          f"ms/step, ratio {a / b:.3f} (goal <= 1.03); per block: loader "
          f"{[round(t * 1e3) for t in times['loader']]}, synthetic {[round(t * 1e3) for t in times['synthetic']]}")


if __name__ == "__main__":
    app.run(main)
