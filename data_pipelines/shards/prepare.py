"""Tokenizes a corpus into ArrayRecord shards, in parallel, with bounded memory, resumably.

    python -m bert_jax.commands.prepare --config=configs/tiny.py --out=/tmp/corpus_prepared \
        --config.data.source=text --config.data.path='/data/wiki/*.txt.gz' \
        --num_workers=8 --docs_per_shard=10000

then train on it with `--config.data.source=prepared --config.data.path=/tmp/corpus_prepared`.
On more than one machine, `python -m bert_jax.commands.prepare_beam` gives the same documents
and format on Apache Beam (prepare_beam.py).

How it works. The source is cut into `--num_parts` parts with `sources.iter_documents`
(part p of P: whole files p, p + P, ... when there are at least P files, else every P-th
document). Worker processes (`--num_workers`) each take whole parts and stream them:
read, tokenize in batches (document_records.py), write shards of `--docs_per_shard` documents
(`part-PPPPP-shard-SSSSS.array_record`, one record per document, see sources/prepared.py). Each
worker holds one batch of documents and one open shard, so memory does not grow with the
corpus.

`--out` may be a bucket (gs://, s3://): shards are written locally and uploaded whole.

Resume. A shard is written under a temporary name and renamed when complete; then its
statistics go to `progress/<shard>.json`, which marks it finished. Run the same command
again: finished shards are kept and their documents skipped (re-read, not re-tokenized);
unfinished ones are rewritten. `prepare_plan.json` pins the parts, shard size and
source, so a resume cannot mix two layouts.

Output: the shards, `tokenizer/` (trained on the source per `config.data.tokenizer`, or
copied from `data.tokenizer.path`; training on "prepared" loads it), and `manifest.json`:
documents, segments, tokens, shards (in document order), skipped records by reason.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import tempfile
import uuid

import ml_collections
from absl import logging

import bert_jax
from bert_jax.progress import progress
from bert_jax.storage import paths
from data_pipelines.shards import document_records
from data_pipelines.sources import documents as sources, file_listing, mixture, prepared
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

PLAN_FILE = "prepare_plan.json"
PROGRESS_DIR = "progress"
TOKENIZER_DIR = "tokenizer"
# One record per chunk: random access (grain) decompresses only the document it reads.
WRITER_OPTIONS = "group_size:1,zstd:1"
# Segments tokenized per call: large enough for the Rust batch, small enough for bounded memory.
SEGMENTS_PER_BATCH = 4096
# Keys of config.data that decide which documents exist and how they split into segments.
SOURCE_KEYS = (
    "source", "path", "field", "tfds_name", "tfds_split", "tfds_data_dir", "segmenter", "max_line_bytes",
)


def shard_name(part: int, shard: int) -> str:
    return f"part-{part:05d}-shard-{shard:05d}.array_record"


def write_json(path, value: dict) -> None:
    """Writes atomically: a reader (or a resume) sees the old file or the new, never half."""
    paths.write_atomically(path, json.dumps(value, indent=2, sort_keys=True))


def read_json(path) -> dict:
    return json.loads(paths.path(path).read_text(encoding="utf-8"))


def _diff(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in now.items() if v - before.get(k, 0)}


class ShardWriter:
    """Writes one shard under a temporary name; `close` renames (or uploads) it whole.

    ArrayRecord writes only local files: for an `out` in a bucket the temporary is local
    and `close` uploads it whole, one object. Shared with prepare_beam.py.
    """

    def __init__(self, out: str, name: str):
        from array_record.python.array_record_module import ArrayRecordWriter  # noqa: PLC0415

        self.name = name
        self._out = paths.path(out)
        local = paths.path(tempfile.gettempdir()) if paths.is_remote(out) else self._out
        # Unique per attempt: a retried Beam bundle may write the same shard beside the first.
        self._tmp = local / f".{self.name}.{uuid.uuid4().hex[:12]}.tmp"
        self._writer = ArrayRecordWriter(str(self._tmp), WRITER_OPTIONS)
        self.documents = self.segments = self.tokens = 0

    def write(self, batch: document_records.TokenizedBatch) -> None:
        for record in batch.records:
            self._writer.write(record)
        self.documents += len(batch.records)
        self.segments += int(batch.segments.sum())
        self.tokens += int(batch.tokens.sum())

    def close(self) -> dict:
        """Puts the shard in place; returns its summary (path, documents, segments, tokens, and its bytes and crc32,
        which the manifest keeps so a reader can tell a damaged shard: sources/prepared.py)."""
        self._writer.close()
        size, crc32 = self._tmp.stat().length, prepared.file_crc32(self._tmp)
        if paths.is_remote(self._out):
            paths.copy_file(self._tmp, self._out / self.name)
            self._tmp.unlink()
        else:
            self._tmp.replace(self._out / self.name)
        return {"path": self.name, "documents": self.documents, "segments": self.segments, "tokens": self.tokens,
                "bytes": size, "crc32": crc32}


def _finish_shard(out: str, writer: ShardWriter, skipped: dict[str, int]) -> dict:
    """Closes the shard, then records its stats in progress/, which marks it finished."""
    summary = {**writer.close(), "skipped": skipped}
    write_json(paths.path(out) / PROGRESS_DIR / f"{writer.name}.json", summary)
    return summary


def _finished_shards(out: str, part: int) -> list[dict]:
    """The part's finished shards, a prefix 0, 1, ... of its shard numbers."""
    finished = []
    while (path := paths.path(out) / PROGRESS_DIR / f"{shard_name(part, len(finished))}.json").exists():
        finished.append(read_json(path))
    return finished


# Where the text bytes this process tokenizes are counted, for the progress bar: prepare() sets it (the bar itself
# in its own process; a process-shared counter in worker processes, through the pool's initializer).
_count_tokenized = None


def _count_bytes(count) -> None:
    global _count_tokenized
    _count_tokenized = count


def _add_to(counter, count: int) -> None:
    with counter.get_lock():
        counter.value += count


def document_bytes(document: list[str]) -> int:
    """The text bytes of a document's segments, a line each: what the progress counts against the files' sizes."""
    return sum(len(segment.encode("utf-8")) + 1 for segment in document)


def prepare_part(out: str, data_dict: dict, part: int, num_parts: int, docs_per_shard: int) -> dict:
    """Tokenizes part `part` of `num_parts` into shards in `out`; resumes after finished shards.

    Skipped records count toward the shard open when they are read; records between two
    shards count toward the earlier one, and those after the last document toward the last
    shard; a part with no document records them in its own progress file.

    Returns the part's progress record: {"part", "shards": [summaries], "skipped"}.
    """
    data_cfg = ml_collections.ConfigDict(data_dict)
    tokenizer = document_records.DocumentTokenizer(tokenizer_lib.load_tokenizer(str(paths.path(out) / TOKENIZER_DIR)))
    shards = _finished_shards(out, part)
    start = sum(s["documents"] for s in shards)
    stats = sources.SkipStats()
    documents = sources.iter_documents(
        data_cfg, shard_index=part, shard_count=num_parts, stats=stats, start=start
    )
    # Counts met while skipping finished documents belong to finished shards.
    baseline = {} if start == 0 else None
    writer = None
    pending: list[list[str]] = []
    pending_segments = 0

    def flush():
        nonlocal pending, pending_segments
        if pending:
            writer.write(tokenizer.tokenize(pending))
            if _count_tokenized is not None:
                _count_tokenized(sum(document_bytes(d) for d in pending))
        pending, pending_segments = [], 0

    for document in documents:
        if baseline is None:
            baseline = stats.as_dict()
        if writer is not None and writer.documents + len(pending) == docs_per_shard:
            flush()
            now = stats.as_dict()
            shards.append(_finish_shard(out, writer, _diff(now, baseline)))
            baseline, writer = now, None
        if writer is None:
            writer = ShardWriter(out, shard_name(part, len(shards)))
        pending.append(document)
        pending_segments += len(document)
        if pending_segments >= SEGMENTS_PER_BATCH:
            flush()
    part_skipped = {}
    if writer is not None:
        flush()
        shards.append(_finish_shard(out, writer, _diff(stats.as_dict(), baseline)))
    elif start == 0:
        part_skipped = stats.as_dict()  # No document at all: nowhere else to count these.
    progress = {"part": part, "shards": shards, "skipped": part_skipped}
    write_json(paths.path(out) / PROGRESS_DIR / f"part-{part:05d}.json", progress)
    return progress


def _prepare_part_task(task: tuple) -> dict:
    return prepare_part(*task)


def _start_worker(counter) -> None:
    limit_threads()
    _count_bytes(functools.partial(_add_to, counter))


def limit_threads() -> None:
    # Worker processes already use every core between them; one Rust thread each.
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _check_plan(out: str, plan: dict) -> None:
    path = paths.path(out) / PLAN_FILE
    if path.exists():
        existing = read_json(path)
        if existing != plan:
            changed = sorted(k for k in set(plan) | set(existing) if plan.get(k) != existing.get(k))
            raise bert_jax.UserError(
                f"{out} was prepared with other settings ({', '.join(changed)}: "
                f"{[existing.get(k) for k in changed]} there, {[plan.get(k) for k in changed]} now); "
                "resume with the same --num_parts/--docs_per_shard/config.data, or use a new --out"
            )
    else:
        write_json(path, plan)


def check_raw_source(data_cfg: ml_collections.ConfigDict) -> None:
    """prepare and prepare_beam tokenize one raw source: not prepared shards, not a mixture."""
    if mixture.has_mixture(data_cfg):
        raise bert_jax.UserError("config.data.mixture is set: prepare each of its sources on its own (its source and "
                         "path as config.data.source and config.data.path, one --out each, the same "
                         "--config.data.tokenizer.path for all), then name the outputs as prepared sources")
    if sources.source_of(data_cfg).tokenized:
        raise bert_jax.UserError(f"config.data.source={data_cfg.source!r} is already prepared; name the raw source")


def prepare(
    data_cfg: ml_collections.ConfigDict,
    out: str,
    *,
    num_workers: int = 1,
    docs_per_shard: int = 10_000,
    num_parts: int = 0,
) -> dict:
    """Prepares (or resumes preparing) data_cfg's source into `out`; returns the manifest.

    num_parts: 0 = as many as input files, at most 4 per worker and at least one per
      worker (parts are the unit of parallelism and of file reading).
    """
    check_raw_source(data_cfg)
    if num_workers < 1 or docs_per_shard < 1 or num_parts < 0:
        raise bert_jax.UserError(
            f"--num_workers={num_workers} and --docs_per_shard={docs_per_shard} must be >= 1, "
            f"--num_parts={num_parts} >= 0"
        )
    files = sources.check_source(data_cfg)  # A missing path fails here, before any work.
    if num_parts == 0:
        num_parts = max(num_workers, min(len(files), 4 * num_workers)) if files else num_workers
    plan = {
        "num_parts": num_parts,
        "docs_per_shard": docs_per_shard,
        "data": {k: data_cfg.get(k) for k in SOURCE_KEYS},
    }
    _check_plan(out, plan)  # an --out prepared with other settings is refused before anything is written there
    if not paths.is_remote(out):  # (a bucket has no folders; gcsfs's mkdir would create a missing bucket)
        (paths.path(out) / PROGRESS_DIR).mkdir(parents=True, exist_ok=True)
    tokenizer = tokenizer_lib.prepare_tokenizer(data_cfg, str(paths.path(out) / TOKENIZER_DIR))

    todo = [p for p in range(num_parts) if not (paths.path(out) / PROGRESS_DIR / f"part-{p:05d}.json").exists()]
    logging.info("preparing %d of %d parts with %d worker(s) into %s", len(todo), num_parts, num_workers, out)
    if not paths.is_remote(out):  # (in a bucket, unfinished shards never leave local disk)
        for stale in paths.path(out).glob(".*.tmp"):
            stale.unlink()  # Shards a killed run left unfinished.
    data_dict = data_cfg.to_dict()
    tasks = [(out, data_dict, p, num_parts, docs_per_shard) for p in todo]
    # spawn: the parent's tokenizers thread pool must not be forked mid-use.
    context = multiprocessing.get_context("spawn")
    counter = context.Value("q", 0)
    bar = progress(total=file_listing.text_bytes(files), desc="prepare", unit="B", unit_scale=True)  # a resume counts from 0
    if num_workers == 1:
        _count_bytes(bar.update)
        try:
            for task in tasks:
                _prepare_part_task(task)
        finally:
            _count_bytes(None)
    else:
        with context.Pool(num_workers, initializer=_start_worker, initargs=(counter,)) as pool:
            parts = pool.imap_unordered(_prepare_part_task, tasks)
            while True:
                try:
                    done = parts.next(timeout=1.0)
                except multiprocessing.TimeoutError:
                    bar.update(counter.value - bar.n)
                    continue
                except StopIteration:
                    break
                bar.update(counter.value - bar.n)
                logging.info("part %d done: %d shard(s)", done["part"], len(done["shards"]))
    if bar.total:  # every file read: the blank lines and markup between documents, and a resume's skip, count too
        bar.update(bar.total - bar.n)
    bar.close()
    manifest = _manifest(out, num_parts, docs_per_shard, tokenizer, data_cfg)
    write_json(paths.path(out) / prepared.MANIFEST_FILE, manifest)
    return manifest


def _manifest(out: str, num_parts: int, docs_per_shard: int, tokenizer, data_cfg) -> dict:
    shards, skipped = [], sources.SkipStats()
    for part in range(num_parts):
        progress = read_json(paths.path(out) / PROGRESS_DIR / f"part-{part:05d}.json")
        skipped.merge(progress["skipped"])
        for shard in progress["shards"]:
            skipped.merge(shard["skipped"])
            shards.append({k: shard[k] for k in prepared.SHARD_KEYS if k in shard})  # (bytes, crc32: since issue 69)
    return {
        "format": prepared.FORMAT,
        "documents": sum(s["documents"] for s in shards),
        "segments": sum(s["segments"] for s in shards),
        "tokens": sum(s["tokens"] for s in shards),
        "shards": shards,
        "skipped": skipped.as_dict(),
        "tokenizer": {
            "dir": TOKENIZER_DIR,
            "kind": tokenizer.kind,
            "vocab_size": tokenizer.get_vocab_size(),
        },
        "source": {k: data_cfg.get(k) for k in SOURCE_KEYS},
        "num_parts": num_parts,
        "docs_per_shard": docs_per_shard,
    }


def summary(manifest: dict, seconds: float) -> str:
    """The line both preparers log at the end."""
    return (f"prepared {manifest['documents']} documents, {manifest['segments']} segments, {manifest['tokens']} "
            f"tokens in {len(manifest['shards'])} shard(s) in {seconds:.1f} s; "
            f"{sources.SkipStats(manifest['skipped']).log_line()}")
