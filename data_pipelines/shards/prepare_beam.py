"""`prepare` on Apache Beam: the same shards, manifest and tokenizer, on one machine or many.

    python -m bert_jax.commands.prepare_beam --config=configs/tiny.py --out=/tmp/corpus_prepared \
        --config.data.source=text --config.data.path='/data/wiki/*.txt.gz' --num_shards=64 \
        [--runner=DirectRunner --direct_num_workers=8 --direct_running_mode=multi_processing]

Every flag this module does not define is a Beam pipeline option: the runner (DirectRunner
by default, multi-process on every core; PrismRunner, DataflowRunner, FlinkRunner,
SparkRunner) and its settings. An option Beam rejects, or does not know, fails before
any work with Beam's message. docs/guides/data.md, "Preparing on Apache Beam", has a Dataflow recipe.

Steps. The tokenizer is trained (or copied) once, here, before the pipeline:
`tokenizer.prepare_tokenizer`, the deterministic trainer on a sample, into `out/tokenizer/`.
Then the pipeline: the source is cut into `--num_parts` parts (`sources.iter_documents`,
as `prepare` cuts it); workers read a part each, skip bad records (counted by reason, as
`prepare` counts them: Beam counters `prepare_beam:<reason>` and the manifest's
`skipped`), and tokenize in batches (document_records.py, the code `prepare` uses).

Determinism. The output does not depend on the runner, the worker count, the parts or
the order work is scheduled in: document d goes to shard `blake2b-64(record(d)) mod
--num_shards` (its tokenized record, so the same text and tokenizer give the same shard),
and a shard holds its documents sorted by (that hash, the record's bytes). The same corpus
and tokenizer give byte-identical shards and manifest, `fingerprint` included: sha256
over the shards' names and digests, in name order. `prepare` gives the same documents,
in another order (its shards follow the source's order).

Output, readable by `source=prepared` unchanged: `shard-SSSSS-of-NNNNN.array_record`
(shards left empty are not written), `tokenizer/`, and `manifest.json` with `prepare`'s
keys (documents, segments, tokens, shards, skipped, tokenizer, source) and `engine`,
`num_shards`, `fingerprint`. `--out` may be a bucket; so may `data.path`. A shard is a
GroupByKey group: it is sorted in one worker's memory (pick --num_shards so that a shard
is well under a worker's RAM, e.g. 4 per GB of text). An `--out` that holds a manifest of
other settings (another source, tokenizer, shard count, or `prepare`'s) is refused unless
`--overwrite`, which deletes that output first. Re-running the same command rewrites the
same bytes.

Progress. Each part's worker writes the text bytes it has tokenized to `out/.progress/<part>.json` (at most every
PROGRESS_EVERY_S seconds, and at its end); the launching process sums them for a progress bar against the input
files' size (bert_jax/progress.py: a bar on a terminal, a line a minute in a log), whatever the runner, and deletes
the folder at the end. It is no part of the output.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterable, Sequence

import ml_collections
import numpy as np
from absl import logging

import bert_jax
from bert_jax.progress import progress
from bert_jax.storage import paths
from data_pipelines.shards import document_records
from data_pipelines.sources import documents as sources, file_listing, prepared
from data_pipelines.shards import prepare as prepare_lib
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

ENGINE = "apache_beam"
SHARDING = "blake2b-64(record) mod num_shards; sorted by (hash, record) within a shard"
# Defaults that make the local runner use every core; any given option overrides them.
_DEFAULT_OPTIONS = ("--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=0")
_SKIPPED = "skipped"


def shard_name(shard: int, num_shards: int) -> str:
    return f"shard-{shard:05d}-of-{num_shards:05d}.array_record"


def pipeline_options(beam_args: Sequence[str]):
    """(PipelineOptions, runner) for these args, checked now: a bad value or runner fails with Beam's message.

    Beam itself only warns about options it does not know and drops them; a typo must not
    quietly run another pipeline, so those fail too. The DirectRunner is Beam's FnApiRunner,
    the engine Beam's DirectRunner picks for a batch pipeline like this one, which honours
    --direct_num_workers and --direct_running_mode; Beam 2.77's DirectRunner would first
    try Prism, whose binary it downloads.
    """
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions  # noqa: PLC0415
    from apache_beam.runners.runner import create_runner  # noqa: PLC0415

    options = PipelineOptions([*_DEFAULT_OPTIONS, *beam_args])
    known = options.get_all_options()  # Beam's argparse exits with its message on a bad value.
    unknown = sorted(set(options.get_all_options(retain_unknown_options=True)) - set(known))
    if unknown:
        raise bert_jax.UserError(f"Beam does not know the pipeline option(s) {unknown} (from {list(beam_args)})")
    runner = create_runner(options.view_as(StandardOptions).runner)  # Beam's ValueError names the valid runners.
    if type(runner).__name__ in ("DirectRunner", "SwitchingDirectRunner"):
        from apache_beam.portability.api import beam_provision_api_pb2  # noqa: PLC0415
        from apache_beam.runners.portability.fn_api_runner import fn_runner  # noqa: PLC0415
        from apache_beam.runners.portability.portable_runner import JobServiceHandle  # noqa: PLC0415

        encoded = JobServiceHandle.encode_pipeline_options(known)  # As Beam's DirectRunner does.
        runner = fn_runner.FnApiRunner(
            provision_info=fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
        )
    return options, runner


def settings(data_cfg: ml_collections.ConfigDict, num_shards: int) -> dict:
    """What decides the output: a manifest with other settings is another output."""
    return {
        "engine": ENGINE,
        "num_shards": num_shards,
        "source": {k: data_cfg.get(k) for k in prepare_lib.SOURCE_KEYS},
        "tokenizer_settings": {**data_cfg.get("tokenizer", {}).to_dict(), "vocab_size": data_cfg.get("vocab_size")},
    }


def check_output(out: str, wanted: dict, overwrite: bool) -> None:
    """Refuses an `out` whose manifest has other settings, unless `overwrite`, which clears it."""
    manifest_path = paths.path(out) / prepared.MANIFEST_FILE
    if not manifest_path.exists():
        return
    existing = prepare_lib.read_json(manifest_path)
    changed = sorted(k for k in wanted if existing.get(k) != wanted[k])
    if not changed:
        manifest_path.unlink()  # Rewritten at the end: until then the output is unfinished.
        return
    if not overwrite:
        raise bert_jax.UserError(
            f"--out={out} holds a manifest with other settings ({', '.join(changed)}: "
            f"{[existing.get(k) for k in changed]} there, {[wanted[k] for k in changed]} now); "
            "use a new --out, or --overwrite to delete that output first"
        )
    logging.warning("--overwrite: deleting the prepared output in %s (%s differ)", out, ", ".join(changed))
    manifest_path.unlink()
    for shard in existing.get("shards", []):
        if (paths.path(out) / shard["path"]).exists():
            (paths.path(out) / shard["path"]).unlink()
    for leftover in (prepare_lib.TOKENIZER_DIR, prepare_lib.PROGRESS_DIR, prepare_lib.PLAN_FILE):
        path = paths.path(out) / leftover
        if path.is_dir():
            path.rmtree()
        elif path.exists():
            path.unlink()


def record_hash(record: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(record, digest_size=8).digest(), "little")


# The folder (in --out) where parts report their progress, and how often a part rewrites its file.
PROGRESS_DIR = ".progress"
PROGRESS_EVERY_S = 5.0


def read_and_tokenize(part: int, data_dict: dict, out: str, num_parts: int, num_shards: int):
    """Part `part`'s documents as (shard, record); then one (_SKIPPED, counts) output."""
    import apache_beam as beam  # noqa: PLC0415

    tokenizer = _document_tokenizer(out)
    stats = sources.SkipStats()
    documents = sources.iter_documents(
        ml_collections.ConfigDict(data_dict), shard_index=part, shard_count=num_parts, stats=stats
    )
    report = paths.path(out) / PROGRESS_DIR / f"part-{part:05d}.json"
    done, reported = 0, time.monotonic()
    for batch in _batches(documents):
        for record in tokenizer.tokenize(batch).records:
            yield record_hash(record) % num_shards, record
        done += sum(prepare_lib.document_bytes(d) for d in batch)
        if time.monotonic() - reported >= PROGRESS_EVERY_S:
            paths.write_atomically(report, json.dumps({"bytes": done}))
            reported = time.monotonic()
    paths.write_atomically(report, json.dumps({"bytes": done}))
    for reason, count in stats.as_dict().items():
        beam.metrics.Metrics.counter("prepare_beam", reason).inc(count)
    yield beam.pvalue.TaggedOutput(_SKIPPED, stats.as_dict())


_TOKENIZERS: dict[str, document_records.DocumentTokenizer] = {}


def _document_tokenizer(out: str) -> document_records.DocumentTokenizer:
    """One per worker process: loading costs more than a small part."""
    if out not in _TOKENIZERS:
        prepare_lib.limit_threads()  # Beam runs a worker per core: one Rust thread each.
        tokenizer = tokenizer_lib.load_tokenizer(str(paths.path(out) / prepare_lib.TOKENIZER_DIR))
        _TOKENIZERS[out] = document_records.DocumentTokenizer(tokenizer)
    return _TOKENIZERS[out]


def _batches(documents: Iterable[list[str]]) -> Iterable[list[list[str]]]:
    batch, segments = [], 0
    for document in documents:
        batch.append(document)
        segments += len(document)
        if segments >= prepare_lib.SEGMENTS_PER_BATCH:
            yield batch
            batch, segments = [], 0
    if batch:
        yield batch


def write_shard(keyed: tuple[int, Iterable[bytes]], out: str, num_shards: int) -> dict:
    """Writes one shard, its records sorted by (hash, bytes); returns its summary and digest."""
    shard, group = keyed
    ordered = sorted(group, key=lambda r: (record_hash(r), r))
    counts = np.array([int.from_bytes(r[:4], "little") for r in ordered], np.int64)
    tokens = np.array([len(r) // 4 - 1 for r in ordered], np.int64) - counts
    writer = prepare_lib.ShardWriter(out, shard_name(shard, num_shards))
    writer.write(document_records.TokenizedBatch(ordered, counts, tokens))
    digest = hashlib.sha256()
    for record in ordered:
        digest.update(len(record).to_bytes(8, "little") + record)
    return {**writer.close(), "sha256": digest.hexdigest()}


def sum_counts(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total = sources.SkipStats()
    for c in counts:
        total.merge(c)
    return total.as_dict()


def write_manifest(_, out: str, base: dict, shards: list[dict], skipped: dict[str, int]) -> dict:
    shards = sorted(shards, key=lambda s: s["path"])
    fingerprint = hashlib.sha256("".join(f"{s['path']}:{s['sha256']}\n" for s in shards).encode()).hexdigest()
    shards = [{k: s[k] for k in prepared.SHARD_KEYS} for s in shards]
    manifest = {
        "format": prepared.FORMAT,
        "documents": sum(s["documents"] for s in shards),
        "segments": sum(s["segments"] for s in shards),
        "tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
        "skipped": skipped,
        "sharding": SHARDING,
        "fingerprint": fingerprint,
        **base,
    }
    prepare_lib.write_json(paths.path(out) / prepared.MANIFEST_FILE, manifest)
    return manifest


def build(pipeline, data_cfg: ml_collections.ConfigDict, out: str, num_parts: int, num_shards: int, base: dict):
    """Adds the preparation to `pipeline` (see the module docstring)."""
    import apache_beam as beam  # noqa: PLC0415

    tokenized = (
        pipeline
        | "Parts" >> beam.Create(range(num_parts))
        | "SpreadParts" >> beam.Reshuffle()
        | "ReadAndTokenize" >> beam.FlatMap(read_and_tokenize, data_cfg.to_dict(), out, num_parts, num_shards)
        .with_outputs(_SKIPPED, main="records")
    )
    shards = (
        tokenized.records
        | "GroupByShard" >> beam.GroupByKey()
        | "WriteShards" >> beam.Map(write_shard, out, num_shards)
    )
    skipped = tokenized[_SKIPPED] | "SumSkipped" >> beam.CombineGlobally(sum_counts)
    return (
        pipeline
        | "One" >> beam.Create([None])
        | "WriteManifest" >> beam.Map(
            write_manifest, out, base, beam.pvalue.AsList(shards), beam.pvalue.AsSingleton(skipped)
        )
    )


def prepare_beam(
    data_cfg: ml_collections.ConfigDict,
    out: str,
    beam_args: Sequence[str] = (),
    *,
    num_shards: int = 64,
    num_parts: int = 0,
    overwrite: bool = False,
) -> dict:
    """Prepares data_cfg's source into `out` on the Beam runner `beam_args` name; returns the manifest.

    num_parts: 0 = one per input file (16 for a non-file source).
    """
    import apache_beam as beam  # noqa: PLC0415

    options, runner = pipeline_options(beam_args)  # Fails here, before any work.
    prepare_lib.check_raw_source(data_cfg)
    if num_shards < 1 or num_parts < 0:
        raise ValueError(f"--num_shards={num_shards} must be >= 1 and --num_parts={num_parts} >= 0")
    files = sources.check_source(data_cfg)  # A missing path fails here too.
    num_parts = num_parts or len(files) or 16
    wanted = settings(data_cfg, num_shards)
    check_output(out, wanted, overwrite)
    if not paths.is_remote(out):  # (in a bucket, unfinished shards never leave a worker's disk)
        for stale in paths.path(out).glob(".*.tmp"):
            stale.unlink()  # Shards a killed run left unfinished.
    tokenizer = tokenizer_lib.prepare_tokenizer(data_cfg, str(paths.path(out) / prepare_lib.TOKENIZER_DIR))
    base = {
        **wanted,
        "tokenizer": {"dir": prepare_lib.TOKENIZER_DIR, "kind": tokenizer.kind, "vocab_size": tokenizer.get_vocab_size()},
    }
    logging.info("preparing %d part(s) into %d shard(s) in %s on Beam", num_parts, num_shards, out)
    pipeline = beam.Pipeline(runner=runner, options=options)
    build(pipeline, data_cfg, out, num_parts, num_shards, base)
    with _ProgressWatch(out, file_listing.text_bytes(files)):
        result = pipeline.run()
        result.wait_until_finish()
    logging.info("Beam counters: %s", skip_counters(result) or "none (nothing skipped, or the runner reports no metrics)")
    return prepared.read_manifest(out)


class _ProgressWatch:
    """While the pipeline runs, a thread sums the parts' progress files into the bar; at the end, the folder goes."""

    def __init__(self, out: str, total: int | None):
        self.folder = paths.path(out) / PROGRESS_DIR
        self.bar = progress(total=total, desc="prepare-beam", unit="B", unit_scale=True)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _done(self) -> int:
        try:
            return sum(json.loads(f.read_text())["bytes"] for f in self.folder.iterdir() if f.name.endswith(".json"))
        except (OSError, ValueError, KeyError):  # a folder not made yet, a file replaced while read: next time
            return self.bar.n

    def _watch(self) -> None:
        while not self.stop.wait(PROGRESS_EVERY_S):
            self.bar.update(self._done() - self.bar.n)

    def __enter__(self):
        if self.folder.exists():
            self.folder.rmtree()  # a killed run's
        self.thread.start()
        return self

    def __exit__(self, *error) -> None:
        self.stop.set()
        self.thread.join()
        if error[0] is None and self.bar.total:
            self.bar.update(self.bar.total - self.bar.n)  # every file read (blank lines and markup count too)
        self.bar.close()
        if self.folder.exists():
            self.folder.rmtree()


def skip_counters(result) -> dict[str, int]:
    """The run's `prepare_beam:<reason>` counters, as the runner reports them."""
    from apache_beam.metrics.metric import MetricsFilter  # noqa: PLC0415

    found = result.metrics().query(MetricsFilter().with_namespace("prepare_beam"))["counters"]
    return dict(sorted((c.key.metric.name, c.committed if c.committed is not None else c.attempted) for c in found))
