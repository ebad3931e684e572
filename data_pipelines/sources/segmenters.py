"""Splitting text into segments (the sentence-like units that builders pair or pack).

`data.segmenter` names the rule:
  line        every non-empty line is a segment;
  blank_line  every paragraph (lines up to a blank line, joined by spaces) is a segment;
  sentence    every line is split into sentences by a simple regex: `.`, `!` or `?`, then
              whitespace, then a capital letter, digit, quote or bracket. It misses
              abbreviations ("e.g. Foo") and non-Latin scripts; use "line" for text that is
              already one sentence per line.

Text files also carry document boundaries in blank lines (see sources.py); this module
only splits the text of one record.
"""

from __future__ import annotations

import re

SEGMENTERS = ("line", "blank_line", "sentence")

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
_WHITESPACE = re.compile(r"\s+")


def check_segmenter(segmenter: str) -> None:
    if segmenter not in SEGMENTERS:
        raise ValueError(f"config.data.segmenter={segmenter!r} is not one of {SEGMENTERS}")


def split_sentences(line: str) -> list[str]:
    """One line of prose -> its sentences, whitespace-normalised, empties dropped."""
    text = _WHITESPACE.sub(" ", line).strip()
    return [s for s in _SENTENCE_END.split(text) if s] if text else []


def split_line(line: str, segmenter: str) -> list[str]:
    """Segments of one line: itself (stripped) for "line"/"blank_line", else its sentences."""
    if segmenter == "sentence":
        return split_sentences(line)
    stripped = line.strip()
    return [stripped] if stripped else []


def split_text(text: str, segmenter: str) -> list[str]:
    """Segments of one record's text (a JSONL field, a Parquet cell, a TFDS feature)."""
    check_segmenter(segmenter)
    if segmenter == "blank_line":
        return [p for p in (_WHITESPACE.sub(" ", p).strip() for p in _PARAGRAPH_BREAK.split(text)) if p]
    return [s for line in text.splitlines() for s in split_line(line, segmenter)]
