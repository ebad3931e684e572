"""Bad cloud input fails before step 0, within seconds, naming the URL and how to set credentials."""
import json
import logging
import time

import ml_collections
import pytest

from bert_jax.storage import paths, preflight
from bert_jax.storage.preflight import StorageError
from bert_jax.train.loop import train_and_evaluate
from bert_jax.run.metrics_file import read_rows, truncate_metrics
from data_pipelines.sources import documents as sources
from test_pretrain import micro_config


def fails_fast(call, *needles):
    start = time.monotonic()
    with pytest.raises(StorageError) as error:
        call()
    assert time.monotonic() - start < preflight.DEADLINE_S
    for needle in needles:
        assert needle in str(error.value), str(error.value)
    return str(error.value)


def test_a_workdir_in_a_missing_bucket_fails_before_anything_is_built(gcs):
    message = fails_fast(lambda: train_and_evaluate(micro_config(), "gs://no-such-bucket/run"),
                         "gs://no-such-bucket/run", "write to", "bucket gs://no-such-bucket", "application-default")
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message


def test_missing_credentials_fail_at_once_instead_of_going_anonymous(gcs, monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")  # as on a machine with no emulator and no login
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")
    fails_fast(lambda: preflight.check_writable("gs://some-bucket/run"), "gs://some-bucket/run",
               "find credentials", "gcloud auth application-default login")


def test_a_read_only_bucket_workdir_fails_naming_it(gcs_via_proxy):
    gcs, proxy = gcs_via_proxy
    bucket = gcs.new()
    proxy.deny("POST", f"/b/{bucket[5:]}/o")  # uploads into the bucket are refused: it is read-only to us
    fails_fast(lambda: preflight.check_writable(f"{bucket}/run"), f"{bucket}/run", "write to", "permission denied")


def test_an_object_we_may_not_read_fails_naming_it(gcs_via_proxy):
    gcs, proxy = gcs_via_proxy
    bucket = gcs.new()
    paths.write_atomically(f"{bucket}/corpus/secret.txt", "text\n")
    proxy.deny("GET", "secret.txt")
    cfg = micro_config()
    cfg.data.source, cfg.data.path = "text", f"{bucket}/corpus/secret.txt"
    fails_fast(lambda: train_and_evaluate(cfg, f"{bucket}/run"), f"{bucket}/corpus/secret.txt",
               "config.data.path", "permission denied")


def test_a_corpus_glob_matching_nothing_in_the_bucket_fails_naming_the_key(gcs):
    bucket = gcs.new()
    paths.write_atomically(f"{bucket}/corpus/a.json", "{}")
    cfg = ml_collections.ConfigDict(dict(source="text", path=f"{bucket}/corpus/*.txt.gz", segmenter="line"))
    with pytest.raises(FileNotFoundError, match=r"config.data.path=.*corpus/\*\.txt\.gz.*matches no files"):
        sources.check_source(cfg)


def test_a_corpus_in_a_missing_bucket_fails_naming_the_key(gcs, tmp_path):
    cfg = micro_config()
    cfg.data.source, cfg.data.path = "text", "gs://no-such-bucket/corpus/*.txt"
    fails_fast(lambda: train_and_evaluate(cfg, str(tmp_path / "run")), "gs://no-such-bucket/corpus",
               "config.data.path", "bucket gs://no-such-bucket")


@pytest.mark.parametrize("where", ["local", "gs"])
def test_a_half_written_metrics_line_is_dropped_with_a_warning_and_the_file_rewritten(where, request, tmp_path,
                                                                                       caplog):
    root = str(tmp_path) if where == "local" else request.getfixturevalue("gcs").new()
    path = paths.path(root) / "metrics.jsonl"
    rows = [{"step": s, "train/loss": 1.0 / s} for s in (1, 2, 3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "train/lo')
    with caplog.at_level(logging.WARNING):
        kept = truncate_metrics(path, last_step=3)
    assert kept == rows and read_rows(path) == rows
    assert path.read_text().endswith("\n")
    assert "line 4 is not a complete JSON row" in caplog.text
    if where == "local":
        assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temporary left behind


@pytest.mark.slow  # gcsfs retries a dropped connection for about a minute before it gives up
def test_a_bucket_dropping_mid_save_or_mid_resume_keeps_the_previous_checkpoint(gcs_via_proxy):
    import grain
    import numpy as np

    from bert_jax.checkpoint import manager as ckpt

    def batches():
        return iter(grain.MapDataset.range(10).to_iter_dataset())

    gcs, proxy = gcs_via_proxy
    directory = f"{gcs.new()}/run/checkpoints"
    cfg = ml_collections.ConfigDict(dict(max_to_keep=3, async_save=True))
    manager = ckpt.make_manager(directory, cfg)
    ckpt.save(manager, 1, {"w": np.arange(8.0)}, batches())
    ckpt.wait_until_finished(manager)
    proxy.down = True
    with pytest.raises(ckpt.CheckpointSaveError, match="saving a checkpoint in gs://.* failed"):
        ckpt.save(manager, 2, {"w": np.arange(8.0) + 2}, batches())
        ckpt.wait_until_finished(manager)
    proxy.down = False
    again = ckpt.make_manager(directory, cfg)
    assert again.all_steps() == [1]
    # A resume while the bucket is away stops without setting the good checkpoint aside.
    proxy.down = True
    with pytest.raises(ckpt.CheckpointUnreachableError, match="the store did not answer"):
        ckpt.restore_latest(again, {"w": np.zeros(8)}, batches())
    proxy.down = False
    assert ckpt.make_manager(directory, cfg).all_steps() == [1]
    restored = ckpt.restore_latest(again, {"w": np.zeros(8)}, batches())
    np.testing.assert_array_equal(restored["w"], np.arange(8.0))
    ckpt.save(again, 3, {"w": np.arange(8.0) + 3}, batches())
    ckpt.wait_until_finished(again)
    assert again.all_steps() == [1, 3]
