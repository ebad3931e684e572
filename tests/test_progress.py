"""Progress of long commands (bert_jax/progress.py, issue 69): tqdm's bar on a terminal, a log line at a bounded
cadence otherwise, each with done of total, the rate and the ETA; `prepare` reports its input bytes that way."""
import logging
import time

import pytest

from bert_jax.progress import progress
from data_pipelines.shards import prepare as prepare_lib
from data_pipelines.sources import file_listing
from test_data_prepare import corpus_cfg, write_corpus


def test_a_terminal_gets_a_bar_with_done_of_total_rate_and_eta(capsys):
    for _ in progress(range(50), desc="work", unit="doc", terminal=True):
        time.sleep(0.002)
    bar = capsys.readouterr().err
    assert "work: 100%" in bar and "50/50" in bar and "doc/s" in bar and "<00:00" in bar


def test_a_log_gets_a_line_at_most_every_interval_and_the_last(caplog):
    interval = 0.05
    start = time.monotonic()
    with caplog.at_level(logging.INFO):
        for _ in progress(range(40), desc="work", unit="doc", log_every_s=interval, terminal=False):
            time.sleep(0.01)
    elapsed = time.monotonic() - start
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("work:")]
    assert 2 <= len(lines) <= elapsed / interval + 2  # the first, one per interval at most, the last
    assert "\r" not in "".join(lines)
    assert "40/40" in lines[-1] and "doc/s" in lines[-1]


def test_prepare_reports_its_input_bytes_with_a_rate(tmp_path, caplog):
    corpus = write_corpus(tmp_path / "corpus")
    with caplog.at_level(logging.INFO):
        prepare_lib.prepare(corpus_cfg(corpus), str(tmp_path / "out"), docs_per_shard=5, num_parts=2)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prepare:")]
    total = sum(f.stat().st_size for f in corpus.iterdir())
    assert lines and "100%" in lines[-1] and "B/s" in lines[-1], lines
    assert file_listing.text_bytes([str(f) for f in corpus.iterdir()]) == total


@pytest.mark.slow  # a Beam pipeline: 12 s on 2 loaded cores
def test_prepare_beam_on_the_direct_runner_reports_the_parts_bytes_and_leaves_no_progress_files(tmp_path, caplog):
    from data_pipelines.shards import prepare_beam

    corpus = write_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    with caplog.at_level(logging.INFO):
        prepare_beam.prepare_beam(corpus_cfg(corpus), str(out), ["--runner=DirectRunner",
                                                                  "--direct_running_mode=in_memory"], num_shards=2)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prepare-beam:")]
    assert lines and "100%" in lines[-1] and "B/s" in lines[-1], lines
    assert not (out / prepare_beam.PROGRESS_DIR).exists()


def test_the_tokenizers_bar_counts_to_the_smaller_of_the_cap_and_the_corpus(tmp_path):
    from data_pipelines.tokenizers import sample

    corpus = write_corpus(tmp_path / "corpus")
    cfg = corpus_cfg(corpus)
    size = sum(f.stat().st_size for f in corpus.iterdir())
    train_share = int(size * (1 - cfg.get("eval_fraction", 0.0)))
    assert sample.expected_bytes(cfg, 100_000_000) == train_share  # not the 100 MB cap
    assert sample.expected_bytes(cfg, 10) == 10
    segments = sample.sample_segments(cfg, 100_000_000, 0, sample.sources.SkipStats())
    read = sum(len(text.encode("utf-8")) for _, _, text in segments)
    assert 0.5 * train_share <= read <= size  # what the bar counts reaches about that total
