"""Raw documents -> prepared records (sources/prepared.py's format), a batch at a time, fast.

`prepare` and `prepare_beam` both tokenize through `DocumentTokenizer`. Its records are
byte-identical to `prepared.encode_document(tokenizer.encode_ids(document))`, document by
document; only the cost differs. Profiling `prepare` (cProfile, wordpiece) showed 3/4 of
the time inside the Rust encoder and the rest in per-segment Python; two levers:

- One Rust call per chunk of segments, not per segment. The segments of a chunk are
  joined with a separator added to a copy of the tokenizer as a special token: special
  tokens are split off the raw text before normalisation, so each segment is normalised,
  pre-tokenized and encoded exactly as alone, and the separator's ids mark where each
  one ends. A segment that holds the separator itself (`\\x1f`, a control character that
  readers.py never lets through) sends its chunk to per-segment encoding; a tokenizer
  whose pre-tokenizer treats the start of the text apart (Metaspace with
  prepend_scheme="first") encodes segment by segment.
- ASCII segments skip the Rust normaliser when it is BERT's (`BertNormalizer` with
  `BertPreTokenizer`): on ASCII text without control characters it only lowercases (NFD,
  accent stripping and CJK spacing change nothing; whitespace is split on either way), and
  Python's `str.lower` does that for a fraction of the cost. A chunk that holds a special
  token's text goes through the full tokenizer, since specials match the raw text.

Records are then cut out of one flat id array with numpy, no Python loop over segments.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence

import numpy as np
import tokenizers

from data_pipelines.tokenizers.kinds import HfTokenizer, Tokenizer

_SEPARATOR = "\x1f"  # ASCII unit separator.
# Segments per Rust call: long enough to amortise the call, short enough for rayon to share a batch.
_SEGMENTS_PER_CHUNK = 256
# Control characters BertNormalizer deletes; in their presence the ASCII path would differ.
_DELETED_BY_BERT = re.compile(r"[\x00-\x08\x0e-\x1e\x7f]")
_U32 = np.dtype("<u4")
_I32 = np.dtype("<i4")


@dataclasses.dataclass(frozen=True)
class TokenizedBatch:
    """records[i] is document i's record; segments[i] and tokens[i] its counts ([num_docs] int64)."""

    records: list[bytes]
    segments: np.ndarray
    tokens: np.ndarray


class DocumentTokenizer:
    """Tokenizes lists of raw documents (list[str] each) into prepared records."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._joined = self._ascii = None
        if isinstance(tokenizer, HfTokenizer) and _segments_join_safely(tokenizer.hf):
            self._joined = _with_separator(tokenizer.hf)
            self._lowercase = _lowercase_only_on_ascii(tokenizer.hf)
            if self._lowercase is not None:
                self._ascii = _with_separator(tokenizer.hf)
                self._ascii.normalizer = None
                self._specials = [t.content for t in tokenizer.hf.get_added_tokens_decoder().values()]

    def tokenize(self, documents: Sequence[Sequence[str]]) -> TokenizedBatch:
        segments = [s for d in documents for s in d]
        counts = np.fromiter(map(len, documents), np.int64, len(documents))
        ids, lengths = self._encode_segments(segments)
        return _records(ids, lengths, counts)

    def _encode_segments(self, segments: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All segments' ids, concatenated ([total] int32), and each one's length ([num_segments])."""
        if self._joined is None:  # SentencePiece encodes a list in one C++ call already.
            encoded = self._tokenizer.encode_ids(segments)
            lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
            return (np.concatenate(encoded) if encoded else np.zeros(0, np.int32)), lengths
        if self._ascii is None:
            return self._encode_group(segments, ascii_path=False)
        is_ascii = np.fromiter((s.isascii() for s in segments), bool, len(segments))
        if is_ascii.all():
            return self._encode_group(segments, ascii_path=True)
        order = np.concatenate([np.flatnonzero(is_ascii), np.flatnonzero(~is_ascii)])
        fast_ids, fast_lengths = self._encode_group([segments[i] for i in order[: is_ascii.sum()]], True)
        full_ids, full_lengths = self._encode_group([segments[i] for i in order[is_ascii.sum():]], False)
        return _reorder(np.concatenate([fast_ids, full_ids]), np.concatenate([fast_lengths, full_lengths]), order)

    def _encode_group(self, segments: list[str], ascii_path: bool) -> tuple[np.ndarray, np.ndarray]:
        chunks = [segments[i:i + _SEGMENTS_PER_CHUNK] for i in range(0, len(segments), _SEGMENTS_PER_CHUNK)]
        texts = [_SEPARATOR.join(c) + _SEPARATOR for c in chunks]
        fast, full, alone = [], [], []
        for index, (chunk, text) in enumerate(zip(chunks, texts)):
            if text.count(_SEPARATOR) != len(chunk):
                alone.append(index)
            elif ascii_path and self._ascii_safe(text):
                fast.append(index)
            else:
                full.append(index)
        flat: list[np.ndarray] = [None] * len(chunks)
        if fast:
            lowered = [texts[i].lower() for i in fast] if self._lowercase else [texts[i] for i in fast]
            for index, encoding in zip(fast, self._ascii.encode_batch_fast(lowered, add_special_tokens=False)):
                flat[index] = np.asarray(encoding.ids, np.int32)
        if full:
            encodings = self._joined.encode_batch_fast([texts[i] for i in full], add_special_tokens=False)
            for index, encoding in zip(full, encodings):
                flat[index] = np.asarray(encoding.ids, np.int32)
        separator = self._joined.token_to_id(_SEPARATOR)
        for index in alone:
            encoded = self._tokenizer.encode_ids(chunks[index])
            flat[index] = np.concatenate([np.append(e, separator).astype(np.int32) for e in encoded])
        ids = np.concatenate(flat) if flat else np.zeros(0, np.int32)
        is_separator = ids == separator
        ends = np.flatnonzero(is_separator)
        lengths = np.diff(ends, prepend=-1) - 1
        return ids[~is_separator], lengths

    def _ascii_safe(self, text: str) -> bool:
        if not text.isascii() or _DELETED_BY_BERT.search(text):
            return False
        lowered = text.lower() if self._lowercase else text
        return not any(s in text or s in lowered for s in self._specials)


def _with_separator(hf: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    copy = tokenizers.Tokenizer.from_str(hf.to_str())
    copy.no_padding()
    copy.no_truncation()
    copy.add_special_tokens([_SEPARATOR])
    return copy


def _segments_join_safely(hf: tokenizers.Tokenizer) -> bool:
    """False where a step treats the text's start apart (Metaspace's prepend_scheme="first")."""
    return '"prepend_scheme":"first"' not in hf.to_str().replace(" ", "")


def _lowercase_only_on_ascii(hf: tokenizers.Tokenizer) -> bool | None:
    """Whether the normaliser lowercases, if on clean ASCII it does nothing else; None if it may."""
    state = json.loads(hf.to_str())
    normalizer, pre_tokenizer = state.get("normalizer") or {}, state.get("pre_tokenizer") or {}
    added = state.get("added_tokens") or []
    if normalizer.get("type") != "BertNormalizer" or pre_tokenizer.get("type") != "BertPreTokenizer":
        return None
    if any(t.get("normalized") or not t.get("special") for t in added):
        return None  # Added words match normalised text: keep to the full path.
    return bool(normalizer.get("lowercase"))


def _reorder(ids: np.ndarray, lengths: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segments given in `order` (segment order[k] is the k-th) back into their own order."""
    starts = np.cumsum(lengths) - lengths
    own_lengths, own_starts = np.empty_like(lengths), np.empty_like(starts)
    own_lengths[order], own_starts[order] = lengths, starts
    out_starts = np.cumsum(own_lengths) - own_lengths
    gather = np.repeat(own_starts - out_starts, own_lengths) + np.arange(own_lengths.sum())
    return ids[gather], own_lengths


def _records(ids: np.ndarray, lengths: np.ndarray, counts: np.ndarray) -> TokenizedBatch:
    """Cuts records out of the flat ids: u32 count | u32 lengths | i32 ids, per document."""
    num_docs = len(counts)
    header = np.empty(num_docs + len(lengths), _U32)
    doc_at = np.cumsum(counts) - counts + np.arange(num_docs)  # Where each document's header starts.
    is_count = np.zeros(len(header), bool)
    is_count[doc_at] = True
    header[is_count], header[~is_count] = counts, lengths
    segment_ends = np.concatenate([[0], np.cumsum(lengths)])
    doc_segment_ends = np.cumsum(counts)
    token_ends = segment_ends[doc_segment_ends]
    token_starts = segment_ends[doc_segment_ends - counts]
    header_bytes, id_bytes = header.tobytes(), ids.astype(_I32, copy=False).tobytes()
    records = [
        header_bytes[4 * h:4 * (h + 1 + c)] + id_bytes[4 * a:4 * b]
        for h, c, a, b in zip(doc_at.tolist(), counts.tolist(), token_starts.tolist(), token_ends.tolist())
    ]
    return TokenizedBatch(records, counts, token_ends - token_starts)
