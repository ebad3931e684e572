"""The user's labelled files -> records, tokenized arrays and batches: CSV/TSV, JSONL, CoNLL, TFDS.

Which rows a task keeps is the task's (bert_jax/finetune/tasks/); the helpers here count the
ones it cannot use by reason, as pre-training does.
"""
import collections
import csv
import io
import json

import grain
import numpy as np
import tokenizers

from bert_jax import UserError
from bert_jax.parallel.mesh import host_share
from bert_jax.storage import paths

FORMATS = ("csv", "tsv", "jsonl", "conll", "squad", "tfds")
IGNORED = -100  # a label position that carries no loss (HF's convention)


def _read_text(path: str) -> str:
    p = paths.path(path)
    if not p.exists():
        raise ValueError(f"data file {path} does not exist")
    return p.read_text(encoding="utf-8")


def read_records(data_cfg, source: str) -> list[dict]:
    """The records of a csv, tsv, jsonl, conll or tfds source, as dicts (CoNLL: {"columns"} or {"ragged"})."""
    fmt = data_cfg.format
    if fmt in ("csv", "tsv"):
        # TSV has no quoting (GLUE's files leave quotes bare; BERT's run_classifier reads them with quotechar=None).
        quoting = csv.QUOTE_MINIMAL if fmt == "csv" else csv.QUOTE_NONE
        reader = csv.DictReader(io.StringIO(_read_text(source)), delimiter="," if fmt == "csv" else "\t",
                                quoting=quoting)
        records = []
        for record in reader:
            if None in record:  # a stray delimiter: every later column would hold its neighbour's value
                raise ValueError(f"{source}, line {reader.line_num}: {len(reader.fieldnames) + len(record[None])} "
                                 f"fields where its header has {len(reader.fieldnames)}")
            records.append(record)
        return records
    if fmt == "jsonl":
        return [json_object(line, source, number)
                for number, line in enumerate(_read_text(source).splitlines(), start=1) if line.strip()]
    if fmt == "conll":
        return _conll_sentences(_read_text(source))
    if fmt == "tfds":
        # Imported here: tensorflow_datasets is heavy and only this format needs it (no TensorFlow needed).
        import tensorflow_datasets as tfds  # noqa: PLC0415

        # Built with file_format="array_record": read by index, without TensorFlow.
        source_ = tfds.data_source(data_cfg.tfds_name, split=source, data_dir=data_cfg.tfds_data_dir or None)
        decode = lambda v: v.decode("utf-8") if isinstance(v, bytes) else v  # noqa: E731
        return [{k: decode(v) for k, v in source_[i].items()} for i in range(len(source_))]
    raise ValueError(f"config.data.format={fmt!r}; expected one of {FORMATS}")


def json_object(line: str, source: str, number: int, unit: str = "line") -> dict:
    """Line `number` of a JSON-lines file as the object it must hold, or a UserError naming the file and the line
    (`unit`: what the file's readers call one, e.g. a BEIR file's "row")."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{source}, {unit} {number}: not a JSON object ({e.msg}, column {e.colno})") from None
    if not isinstance(record, dict):
        raise UserError(f"{source}, {unit} {number}: a JSON {type(record).__name__}, not a JSON object")
    return record


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


def field(row: dict, name: str, skipped: collections.Counter):
    """row[name], or None counted as a missing column."""
    value = row.get(name)
    if value is None:
        skipped[f"missing column {name!r}"] += 1
    return value


def number(value, name: str, skipped: collections.Counter) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        skipped[f"{name} not a number"] += 1
        return None


def text_field_names(task_cfg) -> list[str]:
    return [f.strip() for f in task_cfg.text_fields.split(",") if f.strip()]


def any_empty(texts: list, skipped: collections.Counter) -> bool:
    """Whether a text is blank (counted): a row to skip, not to train on."""
    if any(not str(t).strip() for t in texts):
        skipped["empty text"] += 1
        return True
    return False


def fast_tokenizer(tokenizer, max_length: int) -> tokenizers.Tokenizer:
    """A copy of the encoder's `tokenizers.Tokenizer` (with its [CLS] A [SEP] B [SEP] template), truncating
    and padding to max_length."""
    hf = tokenizer.fast_tokenizer()
    if hf is None:
        raise ValueError(f"fine-tuning needs a tokenizer with offsets and word ids (tokenizer.json); the encoder's "
                         f"is a bare {tokenizer.kind} SentencePiece model")
    fast = tokenizers.Tokenizer.from_str(hf.to_str())
    pad = tokenizer.specials.pad
    fast.enable_truncation(max_length)
    fast.enable_padding(length=max_length, pad_id=fast.token_to_id(pad), pad_token=pad)
    return fast


def encode(encodings, prefix: str = "") -> dict:
    """`tokenizers` encodings -> the encoder's inputs [n, length] int32, their keys prefixed (pairs: "pair_")."""
    return {f"{prefix}input_ids": np.array([e.ids for e in encodings], np.int32),
            f"{prefix}attention_mask": np.array([e.attention_mask for e in encodings], np.int32),
            f"{prefix}token_type_ids": np.array([e.type_ids for e in encodings], np.int32)}


def encode_texts(fast: tokenizers.Tokenizer, rows: list[dict]) -> dict:
    """Rows of one text or a pair ([CLS] A [SEP] B [SEP]) -> the encoder's inputs."""
    return encode(fast.encode_batch([tuple(row["texts"]) if len(row["texts"]) == 2 else row["texts"][0]
                                     for row in rows]))


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
    """Index batch -> this host's share of the (padded, packed) batch every host builds whole."""

    def __init__(self, features: dict, batch_size: int, rows_multiple: int, min_rows: int, share: tuple[int, int]):
        self.features, self.batch_size = features, batch_size
        self.rows_multiple, self.min_rows, self.share = rows_multiple, min_rows, share

    def __call__(self, indices: np.ndarray) -> dict:
        batch = pad_batch({k: self.features[k][indices] for k in model_keys(self.features)}, self.batch_size)
        batch = pack_examples(batch, self.rows_multiple, self.min_rows) if self.rows_multiple else batch
        return host_share(batch, *self.share)


def train_iterator(features: dict, batch_size: int, epochs: int, seed: int, rows_multiple: int = 0,
                   min_rows: int = 0, share: tuple[int, int] = (0, 1)):
    """Batches of `batch_size` over `epochs` shuffled passes (a new order each epoch, from `seed`); the last
    batch is padded with weight-0 rows; with `rows_multiple`, packed (pack_examples). Each host gets its
    `share` (process index, process count) of every batch. A grain iterator: get_state()/set_state() resume it
    exactly."""
    n = len(features["input_ids"])
    ds = grain.MapDataset.range(n).shuffle(seed=seed).repeat(epochs).batch(batch_size, drop_remainder=False)
    return iter(ds.map(_Gather(features, batch_size, rows_multiple, min_rows, share)))


def eval_batches(features: dict, batch_size: int, rows_multiple: int = 0, min_rows: int = 0,
                 share: tuple[int, int] = (0, 1)) -> list[dict]:
    n = len(features["input_ids"])
    gather = _Gather(features, batch_size, rows_multiple, min_rows, share)
    return [gather(np.arange(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]
