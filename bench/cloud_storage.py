"""What a bucket workdir costs the loop, on the local fake-gcs-server emulator.

    python -m bench.cloud_storage [--steps=40] [--every=5]

Prints two figures (issue 19):

  step time    median `perf/step_time_s` of a tiny-config run with the workdir in gs://
               and async checkpoints every `--every` steps, against the same run with no
               checkpoint until the end. Runs alternate A/B/A/B in this process; the
               first step (compilation) is left out.
  loader       batches/s drawn from the train iterator with the corpus (gzipped text)
               in gs://, against the same corpus on local disk, and against the steps/s
               of the train step: the loader keeps ahead when it is faster.

The emulator is a local process, so these measure the client side (gcsfs, TensorStore,
the staging of metrics), not a real network.
"""
import gzip
import statistics
import sys
import tempfile
import time
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from cloud_emulators import make_gcs_bucket, start_fake_gcs  # noqa: E402

STEPS = flags.DEFINE_integer("steps", 40, "train steps per run")
EVERY = flags.DEFINE_integer("every", 5, "checkpoint every N steps in the checkpointing runs")
REPEATS = flags.DEFINE_integer("repeats", 2, "A/B pairs")


def _corpus(root: str) -> str:
    from bert_jax.storage import paths
    from data_pipelines.sources import corpus

    documents = list(corpus.embedded_documents())
    for i in range(4):
        text = "\n\n".join("\n".join(d) for d in documents[i::4]) + "\n"
        paths.write_atomically(paths.path(root) / "corpus" / f"part-{i}.txt.gz", gzip.compress(text.encode()))
    return f"{root}/corpus/*.txt.gz"


def _config(corpus_glob: str, tokenizer: str, steps: int, every: int):
    import bert_jax.configs.tiny

    c = bert_jax.configs.tiny.get_config()
    c.data.source, c.data.path, c.data.tokenizer.path = "text", corpus_glob, tokenizer
    c.train.num_steps, c.train.log_every_steps, c.train.eval_every_steps = steps, 1, 10 * steps
    c.train.warmup_steps = min(c.train.warmup_steps, steps)
    c.checkpoint.every_steps = every
    c.logging.plots = False
    c.logging.peak_flops_per_device = 1e11
    return c


def _median_step_time(workdir: str) -> float:
    from bert_jax.storage.workdir import Workdir
    from bert_jax.run.metrics_file import read_rows

    rows = read_rows(Workdir(workdir).metrics_jsonl)
    return statistics.median(r["perf/step_time_s"] for r in rows if "perf/step_time_s" in r and r["step"] > 1)


def main(argv):
    del argv
    import jax

    from bert_jax.train.loop import train_and_evaluate
    from data_pipelines.loader import pipeline
    from data_pipelines.tokenizers import tokenizer as tokenizer_lib

    local_root = tempfile.mkdtemp(prefix="bench_cloud_")
    jax.config.update("jax_compilation_cache_dir", f"{local_root}/xla_cache")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    process, url = start_fake_gcs(f"{local_root}/fake-gcs-server.log")
    try:
        make_gcs_bucket(url, "bench")
        gs_corpus, local_corpus = _corpus("gs://bench"), _corpus(local_root)
        tokenizer_dir = f"{local_root}/tokenizer"
        c = _config(local_corpus, "", STEPS.value, STEPS.value)
        tokenizer_lib.prepare_tokenizer(c.data, tokenizer_dir)

        with_ckpt, without = [], []
        for r in range(REPEATS.value):
            for every, out in ((EVERY.value, with_ckpt), (STEPS.value, without)):
                workdir = f"gs://bench/run-{r}-{every}"
                train_and_evaluate(_config(gs_corpus, tokenizer_dir, STEPS.value, every), workdir)
                out.append(_median_step_time(workdir))
        step_s = statistics.median(without)
        print(f"median step time, gs:// workdir, async checkpoint every {EVERY.value} steps: "
              f"{statistics.median(with_ckpt) * 1e3:.1f} ms (runs {[round(x * 1e3, 1) for x in with_ckpt]})")
        print(f"median step time, gs:// workdir, no checkpoint until the end:      "
              f"{step_s * 1e3:.1f} ms (runs {[round(x * 1e3, 1) for x in without]})")
        print(f"difference: {100 * (statistics.median(with_ckpt) / step_s - 1):+.1f}%")

        tokenizer = tokenizer_lib.load_tokenizer(tokenizer_dir)
        for name, glob in [("gs://", gs_corpus), ("local", local_corpus)] * 2:
            cfg = _config(glob, tokenizer_dir, STEPS.value, STEPS.value)
            batches = pipeline.build_train_iterator(cfg.data, tokenizer, seed=0, per_host_batch_size=32)
            next(batches)  # start-up (listing, first reads) is not throughput
            start, n = time.perf_counter(), 50
            for _ in range(n):
                next(batches)
            rate = n / (time.perf_counter() - start)
            print(f"loader, corpus in {name:6}: {rate:.1f} batches/s (the step: {1 / step_s:.1f} steps/s)")
    finally:
        process.terminate()


if __name__ == "__main__":
    app.run(main)
