"""Progress of a long command (prepare, the tokenizer's sample, evaluate, mine-pairs, extend-vocab): tqdm's bar on a
terminal, a log line at a bounded cadence otherwise.

A corpus preparation lasts hours, a battery of fine-tunings too; a user should see what is done of how much, at what
rate, and when it ends. On a terminal (stderr is a tty) that is tqdm's bar: done of total where the total is known,
the rate, the ETA. In a log (a batch job, a pipe, `nohup`) a redrawn bar is noise, so the same figures become one
logged line at most every `log_every_s` seconds (tqdm's own mininterval), plus the last. At the lowest layer, so that
every stage (data_pipelines included) may report progress.
"""
from __future__ import annotations

import sys

from absl import logging
from tqdm import tqdm

# Seconds between two logged lines when there is no terminal.
LOG_EVERY_S = 60.0


class _LogLines:
    """A file for tqdm that logs each status it writes as one line (tqdm writes "\\r<status>")."""

    def write(self, text: str) -> None:
        line = text.strip("\r\n ")
        if line:
            logging.info("%s", line)

    def flush(self) -> None:
        pass


def progress(iterable=None, *, total: float | None = None, desc: str, unit: str = "it", unit_scale: bool = False,
             log_every_s: float = LOG_EVERY_S, terminal: bool | None = None) -> tqdm:
    """A tqdm over `iterable` (or one to `update` by hand): a bar on a terminal, else a line every `log_every_s`.

    `terminal`: None asks stderr; True or False forces one (tests)."""
    on_terminal = sys.stderr.isatty() if terminal is None else terminal
    if on_terminal:
        return tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, dynamic_ncols=True)
    return tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=_LogLines(), ascii=True,
                ncols=100, mininterval=log_every_s, maxinterval=max(log_every_s, 10.0))
