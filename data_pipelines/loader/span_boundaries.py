"""The inputs of SpanBERT's span boundary objective (Joshi et al. 2020, §3.2), from a batch's selected tokens.

A span is a maximal run of selected (masked) tokens x_s..x_e, as SpanBERT's own masking merges its
drawn spans before building the SBO's targets (`merge_intervals` in facebookresearch/SpanBERT's
pretraining/fairseq/data/masking.py): two drawn spans that touch are one span, whose boundaries are
the unmasked tokens around both. Each token x_i of the span is predicted from the encoder's outputs at
the boundary tokens x_{s-1} and x_{e+1} and from its position i - s within the span.

A pure function of the selection, vectorised over the batch: the masker calls it on the selection it
drew from its rng (masking.py), so the boundaries repeat exactly on resume like the masks.
"""

from __future__ import annotations

import numpy as np

# The batch keys the masker adds under config.data.span_boundaries, each [B, P] int32 beside masked_positions
# (0 on padding predictions): the left and right boundary positions and the offset within the span.
SPAN_BOUNDARY_KEYS = ("masked_span_left", "masked_span_right", "masked_span_offset")


def span_boundaries(selected: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """selected: [B, L] bool, the tokens chosen for prediction.

    Returns, per token of [B, L] (int32; 0 where the token is not selected):
      left: s - 1, the position of the token just before its span;
      right: e + 1, the position of the token just after it;
      offset: i - s, its 0-based position within the span.
    A span that touches the row's edge has left -1 or right L (no boundary token there). Rows built by
    the example builders always open with [CLS] and close with [SEP], which are never selected, so
    their spans never do.
    """
    selected = np.asarray(selected, bool)
    if selected.ndim != 2:
        raise ValueError(f"selected must be [batch, length], got shape {selected.shape}")
    batch, length = selected.shape
    index = np.broadcast_to(np.arange(length), (batch, length))
    before = np.zeros_like(selected)
    before[:, 1:] = selected[:, :-1]
    after = np.zeros_like(selected)
    after[:, :-1] = selected[:, 1:]
    # A span's start is a selected token whose left neighbour is not; each token's span started at the last start
    # at or before it (a running maximum), and ends at the first end at or after it (a running minimum, reversed).
    start = np.maximum.accumulate(np.where(selected & ~before, index, 0), axis=1)
    end = np.minimum.accumulate(np.where(selected & ~after, index, length)[:, ::-1], axis=1)[:, ::-1]
    zero = np.zeros((batch, length), np.int32)
    left = np.where(selected, start - 1, zero).astype(np.int32)
    right = np.where(selected, end + 1, zero).astype(np.int32)
    offset = np.where(selected, index - start, zero).astype(np.int32)
    return left, right, offset
