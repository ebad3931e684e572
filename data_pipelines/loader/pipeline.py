"""The grain input pipeline: source -> documents -> examples -> batches -> masks.

  sources (sources.py)        documents of this host's share: random access (embedded,
                              tfds, prepared) shuffled globally, or streamed (text, jsonl,
                              parquet: files in a seeded order per epoch, several at once,
                              file_order.py); the split is a hash of the document's index
                              (corpus.is_eval_document; for streams, of its file and its index there).
  mixing                      a mixture's sources (config.data.mixture), each its own stream,
                              mixed by weight (grain's mix; a schedule: mixing.py)
                              Prepared shards go to hosts whole, so a host copies only its
                              own out of a bucket (data.shard_cache_bytes bounds the cache)
  stream.ExampleStream        tokenizes in groups (encode_ids) and runs the example builder
                              (builders.py / packing.py) epoch after epoch, checkpointably
  WindowShuffleIterDataset    shuffles examples within config.data.shuffle_window (grain's,
                              its permutation vectorised: window_shuffle.py)
  batch                       per-host batches: the builder's `stack` makes their rows (NSP/SOP
                              rows are built a whole batch at a time)
  MaskBatch                   dynamic masking (masking.py) of each batch, its rng drawn
                              from (seed, host, batch index): fresh masks every epoch; none under
                              a causal objective (config.data.objective: the targets are the next
                              tokens, bert_jax/objectives/causal_lm.py)
  prefetch                    a thread, or config.data.worker_count grain processes (auto: from
                              the host's cores, workers.py; the batches depend on the number)

Randomness comes only from `seed` and positions, so a restored iterator yields exactly the
batches the original would have. `batch_spec` describes a batch's keys for every builder.
"""

from __future__ import annotations

import collections
import functools
import hashlib
from collections.abc import Iterable

import grain
import ml_collections
import numpy as np
from absl import flags, logging

import bert_jax
from bert_jax.objective_names import is_causal
from data_pipelines.examples import builders
from data_pipelines.sources import corpus, documents as sources, mixture, readers
from data_pipelines.loader import file_order, masking, mixing, span_boundaries, stream, window_shuffle, workers
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

SPLITS = ("train", "eval")


def _host_seed(seed: int, process_index: int, stream_id: int, *more: int) -> int:
    """A 32-bit seed per (run seed, host, use[, source]) so hosts and uses draw independent numbers."""
    return int(np.random.SeedSequence([seed, process_index, stream_id, *more]).generate_state(1)[0])


def _check_host(process_index: int, process_count: int, per_host_batch_size: int) -> None:
    if not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} is not in [0, process_count={process_count})")
    if per_host_batch_size <= 0:
        raise ValueError(f"per_host_batch_size={per_host_batch_size} must be positive")


def batch_spec(data_cfg: ml_collections.ConfigDict, batch_size: int) -> dict[str, tuple[tuple, type]]:
    """name -> (shape, dtype) of every key of a batch; the one description of the layout.

    input_ids, token_type_ids, attention_mask [B, L] int32; masked_positions, masked_ids
    [B, P] int32; masked_weights [B, P] float32; maskable_tokens [B] int32 (non-special tokens
    per row, for the realised mask rate); P = masking.max_predictions(data_cfg); by builder next_sentence_label or
    sentence_order_label [B] int32, or segment_ids and position_ids [B, L] int32; with data.span_boundaries,
    masked_span_left, masked_span_right, masked_span_offset [B, P] int32 (span_boundaries.py). A causal objective's
    batches are unmasked: no masked_* keys, no maskable_tokens.
    """
    extra_keys = builders.example_keys(data_cfg)  # fails now, naming the key, on an unknown builder
    rows, preds = (batch_size, data_cfg.max_seq_length), (batch_size, masking.max_predictions(data_cfg))
    spec = {
        "input_ids": (rows, np.int32),
        "token_type_ids": (rows, np.int32),
        "attention_mask": (rows, np.int32),
    }
    if not is_causal(data_cfg):
        spec.update({
            "masked_positions": (preds, np.int32),
            "masked_ids": (preds, np.int32),
            "masked_weights": (preds, np.float32),
            "maskable_tokens": ((batch_size,), np.int32),
        })
    for key in extra_keys:
        spec[key] = (rows if key in ("segment_ids", "position_ids") else (batch_size,), np.int32)
    if data_cfg.get("span_boundaries", False) and not is_causal(data_cfg):
        spec.update({key: (preds, np.int32) for key in span_boundaries.SPAN_BOUNDARY_KEYS})
    return spec


def _split_indices(size: int, split: str, eval_fraction: float) -> np.ndarray:
    want_eval = split == "eval"
    return np.fromiter(
        (i for i in range(size) if corpus.is_eval_document(i, eval_fraction) == want_eval), np.int64
    )


def _whole_shards(documents, indices: np.ndarray, host: int, hosts: int) -> tuple[np.ndarray, int, int]:
    """Host `host` of `hosts` takes whole prepared shards (host, host + hosts, ...) when there are enough.

    Then a host reads, and in a bucket copies, only its own shards. Returns the indices
    it keeps and the share of them it reads (0 of 1); with fewer shards than hosts, every
    host keeps all indices and reads every hosts-th document (and every shard).
    """
    ranges = documents.shard_ranges()
    if len(ranges) < hosts:
        logging.warning("the prepared corpus has %d shards for %d hosts: every host reads every shard; "
                        "prepare with more shards (--docs_per_shard) so each host reads only its own",
                        len(ranges), hosts)
        return indices, host, hosts
    starts = np.array([start for start, _ in ranges])
    shard = np.searchsorted(starts, indices, side="right") - 1
    return indices[shard % hosts == host], 0, 1


def _read_file(cfg, stats, path: str, counted: bool):
    return sources.source_of(cfg).file_documents([path], stats if counted else readers.DiscardStats())


def document_feed(cfg, tokenizer, *, split: str, shuffle_seed: int | None, shard_index: int,
                  shard_count: int, stats: sources.SkipStats):
    """This share's documents of one split, as a stream.RandomAccessFeed or file_order.FileOrderFeed."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {SPLITS}")
    source = sources.source_of(cfg)
    if isinstance(source, sources.TableSource):
        documents = sources.open_random_access(cfg, stats)
        tokenize = None if source.tokenized else tokenizer.encode_ids
        indices = _split_indices(len(documents), split, cfg.eval_fraction)
        if shard_count > 1 and source.sharded:
            indices, shard_index, shard_count = _whole_shards(documents, indices, shard_index, shard_count)
        return stream.RandomAccessFeed(
            documents, indices, tokenize,
            shard_index=shard_index, shard_count=shard_count, shuffle_seed=shuffle_seed,
        )
    return file_order.FileOrderFeed(
        sources.check_source(cfg), functools.partial(_read_file, cfg, stats),
        functools.partial(file_order.keep_split, split, cfg.eval_fraction),
        tokenizer.encode_ids, shard_index=shard_index, shard_count=shard_count, shuffle_seed=shuffle_seed,
    )


class MaskBatch(grain.transforms.RandomMap):
    """Masks a batch of examples and adds attention_mask; module-level so workers can pickle it. Without a masker
    (a causal objective) the ids pass through as they are: the targets are the next tokens."""

    def __init__(self, masker: masking.Masker | None, extra_keys: tuple[str, ...], pad_id: int):
        self._masker = masker
        self._extra_keys = extra_keys
        self._pad_id = pad_id

    def random_map(self, batch: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
        """batch: input_ids, token_type_ids [B, L] (+ builder keys) -> the batch_spec layout."""
        original = batch["input_ids"]
        if self._masker is None:
            features = {"input_ids": np.asarray(original, np.int32)}
        else:
            features = self._masker(original, rng)
        features["attention_mask"] = (original != self._pad_id).astype(np.int32)
        features["token_type_ids"] = batch["token_type_ids"].astype(np.int32)
        for key in self._extra_keys:
            features[key] = np.asarray(batch[key], np.int32)
        return features


class PackBatch(grain.transforms.Map):
    """A batch as one byte array, in a worker process, to cross into the trainer's process.

    grain moves every array through a shared-memory segment of its own, and each segment
    costs a create, a resource-tracker round trip, an open and an unlink. At 2 workers the
    seven arrays of a batch took a quarter of a core of the trainer's process; one array
    takes a seventh of that. `UnpackBatch` gives back the same arrays, as views.
    """

    def __init__(self, spec: dict[str, tuple[tuple, type]]):
        self._keys = tuple(sorted(spec))

    def map(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.ascontiguousarray(batch[key]).view(np.uint8).ravel() for key in self._keys])


class UnpackBatch(grain.transforms.Map):
    """PackBatch's byte array -> the batch_spec dict, each array a view of it (no copy)."""

    def __init__(self, spec: dict[str, tuple[tuple, type]]):
        self._layout = []
        start = 0
        for key in sorted(spec):
            shape, dtype = spec[key]
            stop = start + int(np.prod(shape)) * np.dtype(dtype).itemsize
            self._layout.append((key, start, stop, shape, np.dtype(dtype)))
            start = stop
        self.nbytes = start

    def map(self, packed: np.ndarray) -> dict[str, np.ndarray]:
        if packed.nbytes != self.nbytes:
            raise ValueError(f"a packed batch of {packed.nbytes} bytes, expected {self.nbytes}: "
                             "the workers and the trainer disagree on config.data")
        flat = np.asarray(packed)
        return {key: flat[start:stop].view(dtype).reshape(shape) for key, start, stop, shape, dtype in self._layout}


def make_mask_batch(cfg, tokenizer, extra_keys: tuple[str, ...] = ()) -> MaskBatch:
    special = tokenizer_lib.special_ids(tokenizer)
    keys = builders.example_keys(cfg) + extra_keys
    if is_causal(cfg):
        return MaskBatch(None, keys, special.pad)
    spec = masking.MaskingSpec.from_config(cfg)
    word_starts = tokenizer.word_start_flags() if spec.kind.by_word else None
    masker = masking.Masker(spec, special, word_starts, tokenizer_size=tokenizer.get_vocab_size())
    return MaskBatch(masker, keys, special.pad)


def _example_stream(cfg, tokenizer, special, *, seed: int, process_index: int, process_count: int,
                    source: tuple[int, str] | None = None) -> stream.ExampleStream:
    """One source's endless training examples on this host; a mixture's source (index, name) draws its
    seeds from its name too, and tags its examples with its index."""
    source_seed = () if source is None else (mixture.source_seed(source[1]),)
    source_stats = sources.SkipStats()
    feed = document_feed(
        cfg, tokenizer, split="train", shuffle_seed=_host_seed(seed, process_index, 0, *source_seed),
        shard_index=process_index, shard_count=process_count, stats=source_stats,
    )
    return stream.ExampleStream(
        feed, functools.partial(builders.make_builder, cfg, special),
        _host_seed(seed, process_index, 3, *source_seed), source_stats, source,
    )


def train_dataset(cfg, tokenizer, *, seed: int, per_host_batch_size: int, process_index: int = 0,
                  process_count: int = 1, first_step: int = 0) -> grain.IterDataset:
    """This host's endless stream of masked training batches (layout: batch_spec).

    The host reads only its share of the documents (disjoint shares that cover the
    source), builds examples, shuffles them within a window, batches without crossing
    hosts and masks each batch afresh. Batches may span an epoch boundary. first_step: the
    run's step before this iterator's first batch (a staged run's stage start), for a
    mixture's weight schedule.
    """
    _check_host(process_index, process_count, per_host_batch_size)
    batch_spec(cfg, per_host_batch_size)  # Fails now on an unknown builder.
    special = tokenizer_lib.special_ids(tokenizer)
    host = dict(seed=seed, process_index=process_index, process_count=process_count)
    stack = builders.make_stacker(cfg, special)
    extra_keys: tuple[str, ...] = ()
    if mixture.has_mixture(cfg):
        # Each source its own stream (own builder, own seeds from its name), mixed by weight;
        # examples carry their source and its epoch into the batch (mixing.TAG_KEYS).
        streams = {name: _example_stream(source_cfg, tokenizer, special, **host, source=(index, name))
                   for index, (name, source_cfg) in enumerate(mixture.source_configs(cfg).items())}
        dataset = mixing.mix_sources(streams, mixture.stages(cfg), per_host_batch_size, first_step)
        stack, extra_keys = mixing.SourceStacker(stack), mixing.TAG_KEYS
    else:
        dataset = _example_stream(cfg, tokenizer, special, **host)
    mask_batch = make_mask_batch(cfg, tokenizer, extra_keys)
    if cfg.shuffle_window > 1:
        dataset = window_shuffle.WindowShuffleIterDataset(
            dataset, window_size=cfg.shuffle_window, seed=_host_seed(seed, process_index, 4)
        )
    dataset = dataset.batch(per_host_batch_size, drop_remainder=True, batch_fn=stack)
    dataset = dataset.random_map(mask_batch, seed=_host_seed(seed, process_index, 1))
    worker_count = workers.worker_count(cfg.worker_count)
    if worker_count > 0:
        if not flags.FLAGS.is_parsed():
            flags.FLAGS.mark_as_parsed()  # grain reads its absl flags; a notebook or pytest parsed none.
        spec = batch_spec(cfg, per_host_batch_size)
        spec.update({key: ((per_host_batch_size,), np.int32) for key in extra_keys})
        dataset = dataset.map(PackBatch(spec)).mp_prefetch(
            grain.MultiprocessingOptions(
                num_workers=worker_count, per_worker_buffer_size=max(1, cfg.prefetch_buffer_size)
            )
        )
        return dataset.map(UnpackBatch(spec))
    if cfg.prefetch_buffer_size > 0:
        # One thread builds and masks batches while the accelerator steps.
        return grain.experimental.ThreadPrefetchIterDataset(
            dataset, prefetch_buffer_size=cfg.prefetch_buffer_size
        )
    return dataset


def build_train_iterator(cfg, tokenizer, *, seed: int, per_host_batch_size: int, process_index: int = 0,
                         process_count: int = 1, first_step: int = 0) -> grain.DatasetIterator:
    """This host's training batch iterator; `get_state()`/`set_state()` resume it exactly.

    Checkpointed with orbax through grain.checkpoint (bert_jax/checkpoint/manager.py). A
    mixture's iterator (mixing.SourceCountingIterator) takes the source tags out of the batches,
    counts sequences, tokens and epochs per source (from this iterator's start), and ends where a
    source that stops (on_exhausted="stop") would begin its second epoch.
    """
    iterator = iter(
        train_dataset(
            cfg, tokenizer, seed=seed, per_host_batch_size=per_host_batch_size,
            process_index=process_index, process_count=process_count, first_step=first_step,
        )
    )
    worker_count = workers.worker_count(cfg.worker_count)
    if worker_count > 0:
        iterator = workers.WatchedIterator(iterator, worker_count)  # a worker dead at start-up: an error, no hang
    if mixture.has_mixture(cfg):
        return mixing.SourceCountingIterator(iterator, mixture.source_names(cfg), mixture.stopping_sources(cfg))
    return iterator


def build_eval_sets(cfg, tokenizer, *, seed: int, per_host_batch_size: int, process_index: int = 0,
                    process_count: int = 1) -> list[tuple[str, list[dict[str, np.ndarray]]]]:
    """[("", eval batches)] for one source; a mixture's [(name, its source's eval batches)] per source.

    Each source of a mixture holds out its own documents (its eval_fraction) and gives
    num_eval_batches batches (build_eval_batches); the run's total is over all of them.
    """
    host = dict(seed=seed, per_host_batch_size=per_host_batch_size, process_index=process_index,
                process_count=process_count)
    if not mixture.has_mixture(cfg):
        return [("", build_eval_batches(cfg, tokenizer, **host))]
    return [(name, build_eval_batches(source_cfg, tokenizer, **host))
            for name, source_cfg in mixture.source_configs(cfg).items()]


def build_eval_batches(cfg, tokenizer, *, seed: int, per_host_batch_size: int, process_index: int = 0,
                       process_count: int = 1) -> list[dict[str, np.ndarray]]:
    """This host's batches of held-out documents: fixed masks, identical on every call.

    Random-access sources: the first held-out documents in source order, examples dealt
    to hosts in turn, min(num_eval_batches, what the split holds) batches on every host.
    Streams: each host reads its own shard's held-out documents and needs
    num_eval_batches of them when there are several hosts (so all run the same count).
    """
    _check_host(process_index, process_count, per_host_batch_size)
    special = tokenizer_lib.special_ids(tokenizer)
    random_access = sources.is_random_access(cfg)
    shard = (0, 1) if random_access else (process_index, process_count)
    feed = document_feed(cfg, tokenizer, split="eval", shuffle_seed=None, shard_index=shard[0],
                         shard_count=shard[1], stats=sources.SkipStats())
    readers = process_count if random_access else 1
    wanted = cfg.num_eval_batches * per_host_batch_size * readers
    builder = builders.make_builder(cfg, special)
    eval_seed = _host_seed(seed, 0 if random_access else process_index, 2)
    examples: list[dict] = []
    for position, document in feed.open(0, 0):
        examples += builder.add_document(document, np.random.default_rng([eval_seed, position]), position)
        if len(examples) >= wanted:
            break
    else:
        examples += builder.finish()
    if random_access:
        num_batches = min(cfg.num_eval_batches, len(examples) // process_count // per_host_batch_size)
        examples = examples[process_index::process_count]
    else:
        num_batches = min(cfg.num_eval_batches, len(examples) // per_host_batch_size)
        if process_count > 1 and num_batches < cfg.num_eval_batches:
            num_batches = 0
    if builder.stats.documents and not builder.stats.examples:
        raise bert_jax.UserError(builder.stats.why_no_examples(cfg.example_builder))
    if num_batches == 0:
        raise ValueError(
            f"the eval split gave {len(examples)} examples on host {process_index}, too few for "
            f"config.data.num_eval_batches={cfg.num_eval_batches} batches of {per_host_batch_size}; "
            f"raise config.data.eval_fraction (now {cfg.eval_fraction}) or lower num_eval_batches"
        )
    if num_batches < cfg.num_eval_batches:  # a smaller eval than asked for is said, not silent
        logging.warning("config.data.num_eval_batches=%d, but the eval split (config.data.eval_fraction=%g) holds "
                        "%d batches of %d on host %d: evaluating on %d", cfg.num_eval_batches, cfg.eval_fraction,
                        num_batches, per_host_batch_size, process_index, num_batches)
    mask_batch = make_mask_batch(cfg, tokenizer)
    batches = []
    for b in range(num_batches):
        stacked = builder.stack(examples[b * per_host_batch_size : (b + 1) * per_host_batch_size])
        batches.append(mask_batch.random_map(stacked, np.random.default_rng([eval_seed, process_index, b])))
    logging.info("eval split: %d batches per host; example building: %s", num_batches, builder.stats.as_dict())
    return batches


def batch_digest(batches: Iterable[dict[str, np.ndarray]]) -> str:
    """sha256 over every batch's keys, dtypes, shapes and bytes, in order: shows that two versions of the
    loader give identical batches (bench/loader_throughput.py, tests/test_data_loader_identity.py).
    `maskable_tokens` is left out: a count the masker derives from the unmasked rows, added after the
    pinned digests were taken, so they still pin every array the model reads."""
    digest = hashlib.sha256()
    for batch in batches:
        for key in sorted(set(batch) - {"maskable_tokens"}):
            array = np.ascontiguousarray(batch[key])
            digest.update(f"{key}:{array.dtype.str}:{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def most_frequent_token_accuracy(batches: Iterable[dict[str, np.ndarray]]) -> float:
    """MLM accuracy of always predicting the most frequent masked id of these batches.

    The floor a trained model must beat: weighted share of masked positions whose
    original id is the set's most frequent masked id.
    """
    counts: collections.Counter = collections.Counter()
    for batch in batches:
        ids = batch["masked_ids"].ravel()
        weights = batch["masked_weights"].ravel()
        for token, weight in zip(ids[weights > 0].tolist(), weights[weights > 0].tolist()):
            counts[token] += weight
    if not counts:
        raise ValueError("the batches hold no masked positions (all masked_weights are 0)")
    return counts.most_common(1)[0][1] / sum(counts.values())
