"""The user's labelled files -> tokenized arrays and batches: CSV/TSV, JSONL, CoNLL, TFDS.

Rows that cannot be used (a missing column, an empty text, an unknown label, a ragged
CoNLL line) are skipped and counted by reason, and the counts logged, as in pre-training.
A validation or test label the training file never had is an error naming it and the
file: silently dropping it would score a different task.
"""
import collections
import csv
import dataclasses
import io
import json

import grain
import numpy as np
import tokenizers
from absl import logging

from bert_jax.storage import paths

FORMATS = ("csv", "tsv", "jsonl", "conll", "squad", "tfds")
IGNORED = -100  # a label position that carries no loss (HF's convention)


@dataclasses.dataclass
class Split:
    name: str
    source: str  # the file (or tfds split) it came from, for messages
    rows: list[dict]
    skipped: collections.Counter


def _read_text(path: str) -> str:
    p = paths.path(path)
    if not p.exists():
        raise ValueError(f"data file {path} does not exist")
    return p.read_text(encoding="utf-8")


def _records(data_cfg, source: str) -> list[dict]:
    fmt = data_cfg.format
    if fmt in ("csv", "tsv"):
        reader = csv.DictReader(io.StringIO(_read_text(source)), delimiter="," if fmt == "csv" else "\t")
        return list(reader)
    if fmt == "jsonl":
        return [json.loads(line) for line in _read_text(source).splitlines() if line.strip()]
    if fmt == "conll":
        return _conll_sentences(_read_text(source))
    if fmt == "tfds":
        import tensorflow_datasets as tfds  # noqa: PLC0415 (only for this format; no TensorFlow needed)

        # Built with file_format="array_record": read by index, without TensorFlow.
        source_ = tfds.data_source(data_cfg.tfds_name, split=source, data_dir=data_cfg.tfds_data_dir or None)
        decode = lambda v: v.decode("utf-8") if isinstance(v, bytes) else v  # noqa: E731
        return [{k: decode(v) for k, v in source_[i].items()} for i in range(len(source_))]
    raise ValueError(f"config.data.format={fmt!r}; expected one of {FORMATS}")


def _conll_sentences(text: str) -> list[dict]:
    """Token per line (columns split on whitespace), a blank line between sentences; -DOCSTART- lines dropped.

    A sentence whose lines have differing column counts comes back as {"ragged": line number}.
    """
    sentences, lines, start = [], [], 1
    for number, line in enumerate(text.splitlines() + [""], start=1):
        if line.startswith("-DOCSTART-"):
            continue
        if line.strip():
            if not lines:
                start = number
            lines.append(line.split())
            continue
        if lines:
            if len({len(cols) for cols in lines}) > 1:
                sentences.append({"ragged": start})
            else:
                sentences.append({"columns": [list(c) for c in zip(*lines)]})
            lines = []
    return sentences


def _field(row: dict, name: str, skipped: collections.Counter):
    value = row.get(name)
    if value is None:
        skipped[f"missing column {name!r}"] += 1
    return value


def _number(value, name: str, skipped: collections.Counter):
    try:
        return float(value)
    except (TypeError, ValueError):
        skipped[f"{name} not a number"] += 1
        return None


def parse_rows(task_cfg, records: list[dict], split: str = "train") -> tuple[list[dict], collections.Counter]:
    """Records -> rows {"texts": [a] or [a, b], "label": raw} or {"words", "tags"}; bad ones counted.

    Sentence embeddings: a training row's label is what its loss needs (none for ranking, the score
    for cosine, a class for softmax); validation and test rows need the `score_field` (Spearman).
    """
    skipped, rows = collections.Counter(), []
    fields = [f.strip() for f in task_cfg.text_fields.split(",") if f.strip()]
    for record in records:
        if task_cfg.kind == "token_classification":
            if "ragged" in record:
                skipped["ragged CoNLL columns"] += 1
                continue
            cols = record["columns"]
            rows.append({"words": cols[task_cfg.word_column], "tags": cols[task_cfg.tag_column]})
            continue
        texts = [_field(record, f, skipped) for f in fields]
        if task_cfg.kind == "sentence_embedding":
            row = _embedding_row(task_cfg, record, texts, split, skipped)
            if row is not None:
                rows.append(row)
            continue
        label = _field(record, task_cfg.label_field, skipped)
        if any(t is None for t in texts) or label is None:
            continue
        if any(not str(t).strip() for t in texts):
            skipped["empty text"] += 1
            continue
        if task_cfg.kind == "regression":
            try:
                label = float(label)
            except ValueError:
                skipped["label not a number"] += 1
                continue
        rows.append({"texts": [str(t) for t in texts], "label": str(label) if task_cfg.kind != "regression"
                     else label})
    return rows, skipped


def _embedding_row(task_cfg, record: dict, texts: list, split: str, skipped: collections.Counter) -> dict | None:
    if len(texts) != 2:
        raise ValueError(f"config.task.text_fields={task_cfg.text_fields!r}: sentence embeddings need two columns")
    if any(t is None for t in texts):
        return None
    if any(not str(t).strip() for t in texts):
        skipped["empty text"] += 1
        return None
    row = {"texts": [str(t) for t in texts], "label": None, "score": None}
    loss = task_cfg.embedding_loss
    if split != "train" or loss == "cosine":
        raw = _field(record, task_cfg.score_field, skipped)
        row["score"] = None if raw is None else _number(raw, task_cfg.score_field, skipped)
        if row["score"] is None:
            return None
        row["label"] = row["score"]
    if split == "train" and loss == "softmax":
        row["label"] = _field(record, task_cfg.label_field, skipped)
        if row["label"] is None:
            return None
        row["label"] = str(row["label"])
    return row


def read_splits(data_cfg, task_cfg) -> dict[str, Split]:
    """train, validation (its file, or a held-out `validation_fraction` of train by `split_seed`), test (optional)."""
    out = {}
    for name in ("train", "validation", "test"):
        source = data_cfg.get(name, "")
        if source and task_cfg.kind == "span_qa":
            from bert_jax.finetune import squad  # noqa: PLC0415

            rows, skipped = squad.read_squad(source)
            out[name] = Split(name, source, rows, skipped)
        elif source:
            rows, skipped = parse_rows(task_cfg, _records(data_cfg, source), name)
            out[name] = Split(name, source, rows, skipped)
    if "train" not in out:
        raise ValueError("config.data.train names no file: set --config.data.train=PATH")
    if "validation" not in out:
        train = out["train"]
        order = np.random.default_rng(data_cfg.split_seed).permutation(len(train.rows))
        held = max(1, int(round(data_cfg.validation_fraction * len(train.rows))))
        out["validation"] = Split("validation", f"{train.source} (held-out {data_cfg.validation_fraction:.0%})",
                                  [train.rows[i] for i in sorted(order[:held])], collections.Counter())
        train.rows = [train.rows[i] for i in sorted(order[held:])]
    for split in out.values():
        if split.skipped:
            reasons = ", ".join(f"{reason}: {n}" for reason, n in split.skipped.most_common())
            logging.warning("%s: skipped %d bad row(s) of %s (%s)", split.name, sum(split.skipped.values()),
                            split.source, reasons)
        if not split.rows:
            raise ValueError(f"{split.source} holds no usable row for the {split.name} split")
    return out


def label_names(task_cfg, splits: dict[str, Split]) -> list[str]:
    """The label vocabulary: config.task.labels if given, else the training file's labels, sorted.

    Rows with a label outside a given vocabulary are skipped and counted; without one, a
    validation or test label the training file lacks fails, naming it and the file.
    """
    key = "tags" if task_cfg.kind == "token_classification" else "label"
    values = lambda row: row[key] if key == "tags" else [row[key]]  # noqa: E731
    train = splits["train"]
    if task_cfg.kind == "sentence_embedding":  # softmax classes: evaluation reads scores, not classes
        splits = {"train": train}
    if task_cfg.labels:
        names = [n.strip() for n in task_cfg.labels.split(",")]
        for split in splits.values():
            kept = [row for row in split.rows if set(values(row)) <= set(names)]
            if len(kept) < len(split.rows):
                split.skipped["unknown label"] += len(split.rows) - len(kept)
                logging.warning("%s: skipped %d row(s) of %s with a label outside config.task.labels", split.name,
                                len(split.rows) - len(kept), split.source)
                split.rows = kept
    else:
        names = sorted({v for row in train.rows for v in values(row)})
    for split in splits.values():
        for row in split.rows:
            unknown = set(values(row)) - set(names)
            if unknown:
                raise ValueError(f"label {sorted(unknown)[0]!r} in {split.source} ({split.name}) never occurs in "
                                 f"the training file {train.source}; its labels are {names}")
    return names


def fast_tokenizer(tokenizer, max_length: int) -> tokenizers.Tokenizer:
    """A copy of the encoder's `tokenizers.Tokenizer` (with its [CLS] A [SEP] B [SEP] template), truncating
    and padding to max_length."""
    hf = getattr(tokenizer, "hf", None)
    if hf is None and hasattr(tokenizer, "_hf_bpe") and tokenizer.kind == "sentencepiece_bpe":
        hf = tokenizer._hf_bpe()
    if hf is None:
        raise ValueError(f"fine-tuning needs a tokenizer with offsets and word ids (tokenizer.json); the encoder's "
                         f"is a bare {tokenizer.kind} SentencePiece model")
    fast = tokenizers.Tokenizer.from_str(hf.to_str())
    pad = tokenizer.specials.pad
    fast.enable_truncation(max_length)
    fast.enable_padding(length=max_length, pad_id=fast.token_to_id(pad), pad_token=pad)
    return fast


def featurize(task_cfg, fast: tokenizers.Tokenizer, rows: list[dict], names: list[str]) -> dict:
    """rows -> {input_ids, attention_mask, token_type_ids: [n, length] int32, labels, label_weights,
    and (tagging) word_positions: [n, length] int32, the word-piece index of each word's first piece, -1 past
    the words kept}."""
    index = {n: i for i, n in enumerate(names)}
    if task_cfg.kind == "sentence_embedding":
        first, second = ([fast.encode_batch([row["texts"][i] for row in rows]) for i in (0, 1)])
        out = {}
        for prefix, encodings in (("", first), ("pair_", second)):
            out[f"{prefix}input_ids"] = np.array([e.ids for e in encodings], np.int32)
            out[f"{prefix}attention_mask"] = np.array([e.attention_mask for e in encodings], np.int32)
            out[f"{prefix}token_type_ids"] = np.array([e.type_ids for e in encodings], np.int32)
        labels = [0 if row["label"] is None else index[row["label"]] if names else row["label"] for row in rows]
        out["labels"] = np.array(labels, np.int32 if names else np.float32)
        out["scores"] = np.array([np.nan if row["score"] is None else row["score"] for row in rows], np.float32)
        out["label_weights"] = np.ones(len(rows), np.float32)
        return out
    if task_cfg.kind == "token_classification":
        encodings = fast.encode_batch([row["words"] for row in rows], is_pretokenized=True)
    else:
        encodings = fast.encode_batch([tuple(row["texts"]) if len(row["texts"]) == 2 else row["texts"][0]
                                       for row in rows])
    out = {"input_ids": np.array([e.ids for e in encodings], np.int32),
           "attention_mask": np.array([e.attention_mask for e in encodings], np.int32),
           "token_type_ids": np.array([e.type_ids for e in encodings], np.int32)}
    n, length = out["input_ids"].shape
    if task_cfg.kind == "classification":
        out["labels"] = np.array([index[row["label"]] for row in rows], np.int32)
        out["label_weights"] = np.ones(n, np.float32)
    elif task_cfg.kind == "regression":
        out["labels"] = np.array([row["label"] for row in rows], np.float32)
        out["label_weights"] = np.ones(n, np.float32)
    else:
        labels = np.zeros((n, length), np.int32)
        weights = np.zeros((n, length), np.float32)
        word_positions = np.full((n, length), -1, np.int32)
        for i, (row, enc) in enumerate(zip(rows, encodings)):
            seen = set()
            for position, word in enumerate(enc.word_ids):
                if word is None or word in seen:
                    continue  # specials, padding, and every piece after a word's first carry no label
                seen.add(word)
                labels[i, position] = index[row["tags"][word]]
                weights[i, position] = 1.0
                word_positions[i, word] = position
        out.update(labels=labels, label_weights=weights, word_positions=word_positions)
    return out


# Host-side bookkeeping of some tasks' features, never fed to the model.
HOST_KEYS = ("word_positions", "example_index", "offsets", "scores")


def model_keys(features: dict) -> list[str]:
    return [k for k in features if k not in HOST_KEYS]


def pad_batch(batch: dict, batch_size: int) -> dict:
    """Pads a short last batch to batch_size with rows of weight 0 (and one real token, so attention is defined)."""
    n = len(batch["input_ids"])
    if n == batch_size:
        return batch
    out = {}
    for key, value in batch.items():
        pad = np.zeros((batch_size - n,) + value.shape[1:], value.dtype)
        if key.endswith("attention_mask"):
            pad[:, 0] = 1
        out[key] = np.concatenate([value, pad])
    return out


def _first_fit(lengths: np.ndarray, length: int) -> tuple[np.ndarray, int]:
    """Longest first, each example into the first row with room: ([n, 2] row and offset of each, rows used)."""
    free, placed = [], np.zeros((len(lengths), 2), np.int64)
    for i in np.argsort(-lengths, kind="stable"):
        row = next((r for r, room in enumerate(free) if room >= lengths[i]), len(free))
        if row == len(free):
            free.append(length)
        placed[i] = row, length - free[row]
        free[row] -= lengths[i]
    return placed, len(free)


def typical_rows(features: dict, batch_size: int, rows_multiple: int, samples: int = 16) -> int:
    """The row count packed batches start from: the most that `samples` random full batches of `features` need.

    Every batch packs into at least this many rows (pack_examples' min_rows), so a run's
    short last batch and its eval batches reuse the shape the training step compiled for;
    only a rare batch that needs more compiles another. Drawn from a fixed seed, so a
    resumed run gets the same count.
    """
    rng = np.random.default_rng(0)
    most = 1
    for prefix in ("", "pair_"):
        if f"{prefix}attention_mask" not in features:
            continue
        mask = features[f"{prefix}attention_mask"]
        n, length = mask.shape
        for _ in range(samples):
            chosen = rng.choice(n, min(batch_size, n), replace=False)
            most = max(most, _first_fit(mask[chosen].sum(1), length)[1])
    return -(-most // rows_multiple) * rows_multiple


def pack_examples(batch: dict, rows_multiple: int, min_rows: int = 0) -> dict:
    """`batch` plus its encoder input packed: the examples end to end in rows of the same length.

    Sentences are short next to max_seq_length (a third of it, often), so a padded batch is
    mostly padding, and the encoder's cost is in tokens. Packing puts the examples longest
    first into the first row with room (first-fit decreasing), each its own segment with
    positions from 0, so attention stays inside it and its hidden states equal its unpacked
    ones (bert_jax.finetune.model unpacks them). The row count is rounded up to
    `rows_multiple`, and raised to `min_rows` (typical_rows), so a run compiles a few shapes
    rather than one per batch; it is a function of the batch and the run's fixed min_rows, so
    a resumed run packs (and draws dropout) as the straight one.

    Adds, per text ("" and, for pairs, "pair_"): packed_{input_ids, token_type_ids,
    attention_mask, segment_ids, position_ids} [rows, length] and example_starts [batch]
    (row * length + offset of each example's first token). Rows must be right-padded.
    """
    out = dict(batch)
    for prefix in ("", "pair_"):
        if f"{prefix}input_ids" not in batch:
            continue
        ids, mask = batch[f"{prefix}input_ids"], batch[f"{prefix}attention_mask"]
        types = batch.get(f"{prefix}token_type_ids")
        if types is None:
            types = np.zeros_like(ids)
        n, length = ids.shape
        lengths = mask.sum(1)
        placed, used = _first_fit(lengths, length)
        rows = max(-(-used // rows_multiple) * rows_multiple, min_rows)
        packed = {k: np.zeros((rows, length), np.int32)
                  for k in ("input_ids", "token_type_ids", "attention_mask", "segment_ids", "position_ids")}
        for i, ((row, offset), size) in enumerate(zip(placed, lengths)):
            where = (row, slice(offset, offset + size))
            packed["input_ids"][where] = ids[i, :size]
            packed["token_type_ids"][where] = types[i, :size]
            packed["attention_mask"][where] = 1
            packed["segment_ids"][where] = i + 1
            packed["position_ids"][where] = np.arange(size)
        out.update({f"{prefix}packed_{k}": v for k, v in packed.items()})
        out[f"{prefix}example_starts"] = (placed[:, 0] * length + placed[:, 1]).astype(np.int32)
    return out


class _Gather:
    def __init__(self, features: dict, batch_size: int, rows_multiple: int, min_rows: int):
        self.features, self.batch_size = features, batch_size
        self.rows_multiple, self.min_rows = rows_multiple, min_rows

    def __call__(self, indices: np.ndarray) -> dict:
        batch = pad_batch({k: self.features[k][indices] for k in model_keys(self.features)}, self.batch_size)
        return pack_examples(batch, self.rows_multiple, self.min_rows) if self.rows_multiple else batch


def train_iterator(features: dict, batch_size: int, epochs: int, seed: int, rows_multiple: int = 0,
                   min_rows: int = 0):
    """Batches of `batch_size` over `epochs` shuffled passes (a new order each epoch, from `seed`); the last
    batch is padded with weight-0 rows; with `rows_multiple`, packed (pack_examples). A grain iterator:
    get_state()/set_state() resume it exactly."""
    n = len(features["input_ids"])
    ds = grain.MapDataset.range(n).shuffle(seed=seed).repeat(epochs).batch(batch_size, drop_remainder=False)
    return iter(ds.map(_Gather(features, batch_size, rows_multiple, min_rows)))


def steps_per_epoch(num_examples: int, batch_size: int) -> float:
    return num_examples / batch_size


def eval_batches(features: dict, batch_size: int, rows_multiple: int = 0, min_rows: int = 0) -> list[dict]:
    n = len(features["input_ids"])
    gather = _Gather(features, batch_size, rows_multiple, min_rows)
    return [gather(np.arange(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]
