"""A corpus or task source names only damage as damage (issue 76, as data_pipelines/sources/prepared.py does).

A storage fault on the way (a bucket's dropped connection, a timeout) is tried again through
bert_jax/storage/retry.py and then raised with its cause; a MemoryError passes through as it is; what is really wrong
with the input (a file that is not Parquet, a TFDS name that does not exist) is still named in one line.
"""
import types

import ml_collections
import pytest

from bert_jax.storage import paths, retry
from data_pipelines.sources import readers


@pytest.fixture(autouse=True)
def no_waits(monkeypatch):
    monkeypatch.setattr(retry, "FIRST_WAIT_S", 0.0)


class Flaky:
    """Raises `error` on its first `failures` calls (every call for -1), then calls `then`."""

    def __init__(self, failures: int, error: BaseException, then):
        self.failures, self.error, self.then, self.calls = failures, error, then, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.failures < 0 or self.calls <= self.failures:
            raise self.error
        return self.then(*args, **kwargs)


@pytest.fixture
def parquet_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": ["one doc.", "another doc."]}), str(path))
    return str(path)


def test_a_parquet_schema_read_through_a_dropped_connection_is_tried_again(parquet_file, monkeypatch):
    flaky = Flaky(2, ConnectionResetError(104, "Connection reset by peer"), paths.path)
    monkeypatch.setattr(paths, "path", flaky)
    readers.check_parquet_columns([parquet_file], "text")
    assert flaky.calls == 3


@pytest.mark.parametrize("fault", [TimeoutError("the bucket did not answer"), MemoryError()])
def test_a_parquet_storage_fault_or_memory_error_is_raised_as_itself_not_named_damage(parquet_file, monkeypatch,
                                                                                      fault):
    flaky = Flaky(-1, fault, paths.path)
    monkeypatch.setattr(paths, "path", flaky)
    with pytest.raises(type(fault)) as raised:
        readers.check_parquet_columns([parquet_file], "text")
    assert raised.value is fault
    assert flaky.calls == (retry.ATTEMPTS if isinstance(fault, OSError) else 1)


def test_a_file_that_is_not_parquet_is_still_named(tmp_path):
    pytest.importorskip("pyarrow")
    path = tmp_path / "corpus.parquet"
    path.write_text("not parquet at all\n")
    with pytest.raises(ValueError, match=r"config.data.path: .*corpus.parquet is not a readable Parquet file"):
        readers.check_parquet_columns([str(path)], "text")


def _fake_source(*args, **kwargs):
    return [{"text": b"Doc one.", "sentence": b"good", "label": 1}]


def _tfds_documents(monkeypatch, data_source):
    tfds = pytest.importorskip("tensorflow_datasets")
    from data_pipelines.sources import table_sources

    monkeypatch.setattr(tfds, "data_source", data_source)
    cfg = ml_collections.ConfigDict({"tfds_name": "tiny_text", "tfds_split": "train", "tfds_data_dir": "gs://b/tfds"})
    return lambda: table_sources.TfdsDocuments(cfg)


def _tfds_task_rows(monkeypatch, data_source):
    tfds = pytest.importorskip("tensorflow_datasets")
    from bert_jax.finetune import battery

    monkeypatch.setattr(tfds, "data_source", data_source)
    spec = types.SimpleNamespace(tfds="glue/sst2", tfds_fields="sentence,label", tfds_labels="negative,positive")
    return lambda: battery._tfds(spec, "train", "gs://b/tfds", "sst2")


@pytest.mark.parametrize("opened", [_tfds_documents, _tfds_task_rows], ids=["corpus", "battery_task"])
def test_a_tfds_source_opened_through_a_dropped_connection_is_tried_again(opened, monkeypatch):
    flaky = Flaky(2, ConnectionResetError(104, "Connection reset by peer"), _fake_source)
    opened(monkeypatch, flaky)()
    assert flaky.calls == 3


@pytest.mark.parametrize("fault", [TimeoutError("the bucket did not answer"), MemoryError()])
@pytest.mark.parametrize("opened", [_tfds_documents, _tfds_task_rows], ids=["corpus", "battery_task"])
def test_a_tfds_storage_fault_or_memory_error_is_raised_as_itself_not_named_missing(opened, fault, monkeypatch):
    flaky = Flaky(-1, fault, _fake_source)
    with pytest.raises(type(fault)) as raised:
        opened(monkeypatch, flaky)()
    assert raised.value is fault and not isinstance(raised.value, FileNotFoundError)
    assert flaky.calls == (retry.ATTEMPTS if isinstance(fault, OSError) else 1)


@pytest.mark.parametrize("opened", [_tfds_documents, _tfds_task_rows], ids=["corpus", "battery_task"])
def test_a_tfds_name_it_does_not_know_is_still_named(opened, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    unknown = tfds.core.registered.DatasetNotFoundError("Dataset no_such_dataset not found.")
    with pytest.raises(ValueError if opened is _tfds_task_rows else FileNotFoundError, match="tfds"):
        opened(monkeypatch, Flaky(-1, unknown, _fake_source))()
