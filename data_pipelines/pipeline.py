"""The grain input pipeline for BERT pre-training (MLM + NSP) on a source held in memory.

Stages, each a function the streaming pipeline of a later issue can replace on its own:

  source_documents(cfg)            -> documents (lists of sentence strings)
  split_documents(..., split)      -> the train or the held-out eval documents
  tokenize_documents(docs, tok)    -> documents as lists of token-id arrays
  build_examples(cfg, tok, ...)    -> NSP sentence pairs, [N, L] arrays in memory
  train_dataset(examples, ...)     -> per-host shard, shuffled each epoch, masked each
                                      read, batched: a checkpointable grain IterDataset

Randomness comes only from `seed` and positions: the shuffle from (seed, host, epoch),
each mask from (seed, host, position of the example in the repeated stream). A restored
iterator therefore yields exactly the batches the original would have.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable, Iterator, Sequence

import grain
import ml_collections
import numpy as np
import tokenizers

from data_pipelines import corpus, masking, nsp
from data_pipelines import tokenizer as tokenizer_lib
from data_pipelines.tokenizer import SpecialIds

SOURCES = {"embedded": corpus.embedded_documents}
SPLITS = ("train", "eval")


def default_data_config() -> ml_collections.ConfigDict:
    """The `config.data` block: the embedded corpus, BERT-base sequence settings."""
    return ml_collections.ConfigDict(
        {
            "source": "embedded",  # One of SOURCES.
            "vocab_size": 8192,
            "max_seq_length": 128,
            "max_predictions_per_seq": 20,
            "mask_rate": 0.15,
            "short_seq_prob": 0.1,
            "nsp_random_prob": 0.5,
            # Share of documents held out for eval, by hash. The embedded corpus has ~360
            # documents; 0.05 holds out ~17 of them, ~120 examples.
            "eval_fraction": 0.05,
            "num_eval_batches": 4,  # At most; fewer if the eval split is smaller.
            "worker_count": 0,  # 0: in-process; >0: grain worker processes.
            "prefetch_buffer_size": 2,  # Batches read ahead (per worker if any).
        }
    )


def source_documents(cfg: ml_collections.ConfigDict) -> Iterator[list[str]]:
    """Yields every document of cfg.source, in the source's fixed order."""
    if cfg.source not in SOURCES:
        raise ValueError(
            f"config.data.source={cfg.source!r} is not a known source; known: {sorted(SOURCES)}"
        )
    return SOURCES[cfg.source]()


def split_documents(
    documents: Iterable[list[str]], split: str, eval_fraction: float
) -> Iterator[list[str]]:
    """Keeps the documents of one split: 'eval' are those `is_eval_document` holds out."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not one of {SPLITS}")
    want_eval = split == "eval"
    for index, document in enumerate(documents):
        if corpus.is_eval_document(index, eval_fraction) == want_eval:
            yield document


def tokenize_documents(
    documents: Iterable[list[str]],
    tokenizer: tokenizers.Tokenizer,
    segments_per_call: int = 4096,
) -> Iterator[list[np.ndarray]]:
    """Tokenizes documents segment by segment, without specials.

    Segments of many documents go to `encode_batch` together (parallel, in Rust).

    Yields:
      One list per document: [num_tokens] int32 arrays, one per segment.
    """
    pending: list[list[str]] = []
    pending_segments = 0
    for document in documents:
        pending.append(document)
        pending_segments += len(document)
        if pending_segments >= segments_per_call:
            yield from _tokenize_group(pending, tokenizer)
            pending, pending_segments = [], 0
    yield from _tokenize_group(pending, tokenizer)


def _tokenize_group(documents: list[list[str]], tokenizer: tokenizers.Tokenizer):
    flat = [segment for document in documents for segment in document]
    encodings = tokenizer.encode_batch(flat, add_special_tokens=False) if flat else []
    ids = iter(np.asarray(e.ids, np.int32) for e in encodings)
    for document in documents:
        yield [next(ids) for _ in document]


def prepare_tokenizer(cfg: ml_collections.ConfigDict, tokenizer_dir: str) -> tokenizers.Tokenizer:
    """Loads the tokenizer in tokenizer_dir, or trains one on the train split and saves it.

    `tokenizers`' WordPiece trainer breaks frequency ties in hash-map order, so two
    trainings on the same text may differ in a few entries: a run therefore trains
    once, saves, and every resume (or other host) loads the saved one.
    """
    if os.path.isdir(tokenizer_dir) and os.listdir(tokenizer_dir):
        tokenizer = tokenizer_lib.load_tokenizer(tokenizer_dir)
    else:
        texts = (
            " ".join(document)
            for document in split_documents(source_documents(cfg), "train", cfg.eval_fraction)
        )
        tokenizer = tokenizer_lib.train_wordpiece(texts, cfg.vocab_size)
        tokenizer_lib.save_tokenizer(tokenizer, tokenizer_dir)
    tokenizer_lib.special_ids(tokenizer)  # Fails early, naming a missing special token.
    return tokenizer


def build_examples(
    cfg: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer, *, split: str, seed: int
) -> tuple[dict[str, np.ndarray], nsp.NspStats]:
    """All NSP examples of one split, in memory (fine for the embedded corpus only).

    Returns `nsp.build_nsp_examples`'s arrays: input_ids [N, L], token_type_ids [N, L],
    next_sentence_label [N]; and what was skipped.
    """
    documents = split_documents(source_documents(cfg), split, cfg.eval_fraction)
    return nsp.build_nsp_examples(
        list(tokenize_documents(documents, tokenizer)),
        special_ids=tokenizer_lib.special_ids(tokenizer),
        max_seq_length=cfg.max_seq_length,
        short_seq_prob=cfg.short_seq_prob,
        nsp_random_prob=cfg.nsp_random_prob,
        seed=seed,
    )


class ExampleTable(Sequence):
    """Random access to in-memory example arrays: item i is a dict of row i of each array."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        lengths = {name: len(array) for name, array in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"example arrays differ in length: {lengths}")
        self._arrays = arrays
        self._length = next(iter(lengths.values()))

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {name: array[index] for name, array in self._arrays.items()}


class MlmFeatures(grain.transforms.RandomMap):
    """Masks one NSP example and adds the model's other inputs.

    Module-level (not a closure) so grain can pickle it into worker processes.
    """

    def __init__(
        self, special_ids: SpecialIds, vocab_size: int, mask_rate: float, max_predictions: int
    ):
        self._special_ids = special_ids
        self._vocab_size = vocab_size
        self._mask_rate = mask_rate
        self._max_predictions = max_predictions

    def random_map(self, example: dict[str, np.ndarray], rng: np.random.Generator):
        """example: input_ids [L], token_type_ids [L], next_sentence_label [] -> features."""
        features = masking.mask_example(
            example["input_ids"],
            rng,
            special_ids=self._special_ids,
            vocab_size=self._vocab_size,
            mask_rate=self._mask_rate,
            max_predictions_per_seq=self._max_predictions,
        )
        features["token_type_ids"] = example["token_type_ids"].astype(np.int32)
        real = example["input_ids"] != self._special_ids.pad
        features["attention_mask"] = real.astype(np.int32)
        features["next_sentence_label"] = np.int32(example["next_sentence_label"])
        return features


def _host_seed(seed: int, process_index: int, stream: int) -> int:
    """A 32-bit seed per (run seed, host, use) so hosts and uses draw independent numbers."""
    return int(np.random.SeedSequence([seed, process_index, stream]).generate_state(1)[0])


def _check_host(process_index: int, process_count: int, per_host_batch_size: int) -> None:
    if not 0 <= process_index < process_count:
        raise ValueError(
            f"process_index={process_index} is not in [0, process_count={process_count})"
        )
    if per_host_batch_size <= 0:
        raise ValueError(f"per_host_batch_size={per_host_batch_size} must be positive")


def train_dataset(
    examples: dict[str, np.ndarray],
    cfg: ml_collections.ConfigDict,
    special_ids: SpecialIds,
    *,
    seed: int,
    per_host_batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
) -> grain.IterDataset:
    """This host's endless stream of masked training batches.

    The host keeps examples[process_index::process_count] (disjoint shares that cover
    the data), reshuffles them every epoch, masks each read afresh, and batches
    without crossing hosts. Batches may span an epoch boundary.

    Yields:
      input_ids, token_type_ids, attention_mask: [B, L] int32;
      masked_positions, masked_ids: [B, P] int32; masked_weights: [B, P] float32;
      next_sentence_label: [B] int32. B = per_host_batch_size, P = max_predictions_per_seq.
    """
    _check_host(process_index, process_count, per_host_batch_size)
    shard = grain.MapDataset.source(ExampleTable(examples))[process_index::process_count]
    if len(shard) == 0:
        raise ValueError(
            f"host {process_index} of {process_count} has no training examples "
            f"(the split has {len(examples['input_ids'])})"
        )
    dataset = (
        shard.shuffle(seed=_host_seed(seed, process_index, 0))
        .repeat(None)  # Reseeds the shuffle each epoch.
        .random_map(
            MlmFeatures(special_ids, cfg.vocab_size, cfg.mask_rate, cfg.max_predictions_per_seq),
            seed=_host_seed(seed, process_index, 1),
        )
        .batch(per_host_batch_size, drop_remainder=True)
    )
    # Examples are in memory: reading threads would only contend for the GIL. One
    # thread reads ahead so batches are ready while the accelerator steps.
    read_options = grain.ReadOptions(
        num_threads=1 if cfg.prefetch_buffer_size > 0 else 0,
        prefetch_buffer_size=max(1, cfg.prefetch_buffer_size),
    )
    iter_dataset = dataset.to_iter_dataset(read_options)
    if cfg.worker_count > 0:
        iter_dataset = iter_dataset.mp_prefetch(
            grain.MultiprocessingOptions(
                num_workers=cfg.worker_count,
                per_worker_buffer_size=max(1, cfg.prefetch_buffer_size),
            )
        )
    return iter_dataset


def build_train_iterator(
    cfg: ml_collections.ConfigDict,
    tokenizer: tokenizers.Tokenizer,
    *,
    seed: int,
    per_host_batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
) -> grain.DatasetIterator:
    """This host's training batch iterator; `get_state()`/`set_state()` resume it exactly.

    Checkpoint it with orbax through `grain.checkpoint.CheckpointSave` /
    `CheckpointRestore`. Batches as in `train_dataset`.
    """
    examples, _ = build_examples(cfg, tokenizer, split="train", seed=seed)
    dataset = train_dataset(
        examples,
        cfg,
        tokenizer_lib.special_ids(tokenizer),
        seed=seed,
        per_host_batch_size=per_host_batch_size,
        process_index=process_index,
        process_count=process_count,
    )
    return iter(dataset)


def eval_batches(
    examples: dict[str, np.ndarray],
    cfg: ml_collections.ConfigDict,
    special_ids: SpecialIds,
    *,
    seed: int,
    per_host_batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
) -> list[dict[str, np.ndarray]]:
    """This host's eval batches: fixed masks, unshuffled, at most cfg.num_eval_batches.

    Every host gets the same number of full batches (so collective eval steps match),
    from its share examples[process_index::process_count]. Batch layout as in
    `train_dataset`.
    """
    _check_host(process_index, process_count, per_host_batch_size)
    total = len(examples["input_ids"])
    num_batches = min(cfg.num_eval_batches, total // process_count // per_host_batch_size)
    if num_batches == 0:
        raise ValueError(
            f"the eval split has {total} examples, too few for one batch of "
            f"{per_host_batch_size} per host on {process_count} host(s); raise "
            f"config.data.eval_fraction (now {cfg.eval_fraction})"
        )
    shard = ExampleTable(examples)
    to_features = MlmFeatures(
        special_ids, cfg.vocab_size, cfg.mask_rate, cfg.max_predictions_per_seq
    )
    mask_seed = _host_seed(seed, process_index, 2)
    batches = []
    for b in range(num_batches):
        rows = []
        for k in range(b * per_host_batch_size, (b + 1) * per_host_batch_size):
            # The mask of eval example k depends on k alone: the same on every call.
            rng = np.random.default_rng([mask_seed, k])
            rows.append(to_features.random_map(shard[process_index + k * process_count], rng))
        batches.append({name: np.stack([r[name] for r in rows]) for name in rows[0]})
    return batches


def build_eval_batches(
    cfg: ml_collections.ConfigDict,
    tokenizer: tokenizers.Tokenizer,
    *,
    seed: int,
    per_host_batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
) -> list[dict[str, np.ndarray]]:
    """This host's batches of held-out documents, identical on every call (see eval_batches)."""
    examples, _ = build_examples(cfg, tokenizer, split="eval", seed=seed)
    return eval_batches(
        examples,
        cfg,
        tokenizer_lib.special_ids(tokenizer),
        seed=seed,
        per_host_batch_size=per_host_batch_size,
        process_index=process_index,
        process_count=process_count,
    )


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
