"""DIR/metrics.jsonl, the file: one JSON object per line, read back on resume and by sweep summaries.

A crash (or a kill) can leave the last line half-written on a local disk. Reading drops
such a line with a warning instead of stopping the resume; the resume then rewrites the
file whole, atomically (storage.paths.write_atomically).
"""
import json

from absl import logging

from bert_jax.storage import paths


def read_rows(path) -> list[dict]:
    """The rows of a metrics.jsonl; a line a crash left half-written (or any unparsable one) is dropped, warned."""
    path = paths.path(path)
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            logging.warning("%s line %d is not a complete JSON row (a crash mid-write?): dropped: %.80r",
                            path, number, line)
    return rows


def as_text(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def truncate_metrics(path, last_step: int) -> list[dict]:
    """Keeps the complete rows up to `last_step` (later steps are re-run and logged anew), rewritten atomically.

    Returns the rows kept. The file is rewritten only if that changes it.
    """
    path = paths.path(path)
    if not path.exists():
        return []
    before = path.read_text()
    rows = [r for r in read_rows(path) if r["step"] <= last_step]
    if as_text(rows) != before:
        paths.write_atomically(path, as_text(rows))
    return rows
