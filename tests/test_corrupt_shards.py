"""Damaged prepared shards (issue 69), locally and in a bucket (the gs:// emulator): a truncated or missing shard is
named in one line when the config is checked, before anything is written (the manifest keeps each shard's size); a
shard with a flipped byte (the same size) when it is first opened, by the CRC-32 the manifest keeps; a shard gone from
the bucket mid-run when it is read. Each of them stops the run (docs/guides/data.md, "Damaged shards")."""
import shutil

import pytest

import bert_jax
from bert_jax.storage import paths
from bert_jax.train.config_validation import check_config
from data_pipelines.sources import prepared
from test_data_prepare import corpus_cfg, run_prepare, write_corpus
from test_pretrain import micro_config


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepared")
    manifest = run_prepare(corpus_cfg(write_corpus(root / "corpus")), root / "out")
    assert all({"bytes", "crc32"} <= set(s) for s in manifest["shards"])
    return root / "out"


def fresh_copy(prepared_dir, tmp_path) -> str:
    out = tmp_path / "out"
    shutil.copytree(prepared_dir, out)
    return str(out)


def run_config(path: str):
    c = micro_config()
    c.data.source, c.data.path, c.data.eval_fraction = "prepared", path, 0.2
    return c


def first_shard(directory: str) -> str:
    return prepared.read_manifest(directory)["shards"][0]["path"]


def flip_a_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


def test_an_intact_prepared_folder_passes_the_check(prepared_dir, tmp_path):
    check_config(run_config(fresh_copy(prepared_dir, tmp_path)), str(tmp_path / "run"))


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_truncated_or_missing_local_shard_is_named_before_anything_is_written(prepared_dir, tmp_path, damage):
    out = fresh_copy(prepared_dir, tmp_path)
    shard = paths.path(out) / first_shard(out)
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:-7])
    else:
        shard.unlink()
    with pytest.raises(bert_jax.UserError) as refused:
        check_config(run_config(out), str(tmp_path / "run"))
    message = str(refused.value)
    assert "\n" not in message and f"shard {first_shard(out)} " in message
    assert ("the manifest says" in message) if damage == "truncated" else ("is missing" in message)
    assert not (tmp_path / "run").exists()


def test_a_flipped_byte_in_a_local_shard_is_named_when_it_is_opened(prepared_dir, tmp_path):
    out = fresh_copy(prepared_dir, tmp_path)
    shard = paths.path(out) / first_shard(out)
    shard.write_bytes(flip_a_byte(shard.read_bytes()))
    with pytest.raises(prepared.DamagedShardError, match=rf"shard {first_shard(out)} has CRC-32 \w+, the manifest "
                                                         rf"says \w+ \(its bytes changed\)"):
        prepared.PreparedDocuments(out)


def test_damaged_shards_in_a_bucket_are_named_before_training_or_when_read(prepared_dir, gcs, tmp_path, monkeypatch):
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    bucket = gcs.new()
    remote = f"{bucket}/prepared"
    for file in sorted(prepared_dir.rglob("*")):  # (the local folder: pathlib's rglob)
        if file.is_file():
            paths.copy_file(file, f"{remote}/{file.relative_to(prepared_dir)}")
    name = first_shard(remote)
    shard = paths.path(remote) / name
    good = shard.read_bytes()

    shard.write_bytes(good[:-7])  # truncated: refused by the config check
    with pytest.raises(bert_jax.UserError, match=rf"shard {name} is {len(good) - 7} bytes, the manifest says "
                                                 rf"{len(good)}"):
        check_config(run_config(remote), str(tmp_path / "run"))

    shard.write_bytes(flip_a_byte(good))  # the same size: named when the shard is first read, its copy deleted
    documents = prepared.PreparedDocuments(remote)
    with pytest.raises(prepared.DamagedShardError, match=rf"shard {name} has CRC-32"):
        documents[0]
    assert not [f for f in (tmp_path / "cache").rglob(name)]

    shard.write_bytes(good)  # restored: the same object reads again (a fresh download)
    assert len(documents[0]) > 0
    later = prepared.read_manifest(remote)["shards"][-1]["path"]
    (paths.path(remote) / later).unlink()  # gone mid-run, before its first read
    with pytest.raises(prepared.DamagedShardError, match=rf"shard {later} is gone \(the manifest lists it\)"):
        documents[len(documents) - 1]


def rewrite_first_shard(out: str, records: list[bytes]) -> str:
    """The first shard holding `records`, the manifest's size and CRC-32 kept in step: only its records are wrong."""
    import json

    from array_record.python.array_record_module import ArrayRecordWriter

    from data_pipelines.shards.prepare import WRITER_OPTIONS

    manifest = prepared.read_manifest(out)
    entry = manifest["shards"][0]
    file = paths.path(out) / entry["path"]
    writer = ArrayRecordWriter(str(file), WRITER_OPTIONS)
    for record in records:
        writer.write(record)
    writer.close()
    entry.update(bytes=file.stat().length, crc32=prepared.file_crc32(file))
    (paths.path(out) / prepared.MANIFEST_FILE).write_text(json.dumps(manifest))
    return entry["path"]


def test_a_record_that_does_not_decode_is_named_damage(prepared_dir, tmp_path):
    out = fresh_copy(prepared_dir, tmp_path)
    count = prepared.read_manifest(out)["shards"][0]["documents"]
    name = rewrite_first_shard(out, [b"\x07\x00"] * count)  # shorter than a document's header
    with pytest.raises(prepared.DamagedShardError, match=rf"shard {name} record 0 does not decode \(record of 2 "
                                                         rf"bytes is too short.*the prepared corpus is damaged"):
        prepared.PreparedDocuments(out)[0]


def test_a_shard_that_is_not_a_records_file_is_named_damage(prepared_dir, tmp_path):
    """Bytes that ArrayRecord cannot read, under a manifest that kept no CRC-32 (one written before CRCs were)."""
    import json

    out = fresh_copy(prepared_dir, tmp_path)
    manifest = prepared.read_manifest(out)
    name = manifest["shards"][0]["path"]
    for shard in manifest["shards"]:
        del shard["crc32"]
    (paths.path(out) / prepared.MANIFEST_FILE).write_text(json.dumps(manifest))
    shard = paths.path(out) / name
    shard.write_bytes(b"\x00" * shard.stat().length)
    with pytest.raises(prepared.DamagedShardError, match=rf"shard {name} is not a records file \(.*Riegeli"):
        prepared.PreparedDocuments(out)


class FlakyCopies:
    """paths.local_copy behind a connection that drops `failures` times (then, or with failures=-1 never, copies)."""

    def __init__(self, failures: int, error: BaseException):
        self.failures, self.error, self.calls = failures, error, 0
        self.copy = paths.local_copy

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.failures < 0 or self.calls <= self.failures:
            raise self.error
        return self.copy(*args, **kwargs)


@pytest.fixture
def no_waits(monkeypatch):
    from bert_jax.storage import retry

    monkeypatch.setattr(retry, "FIRST_WAIT_S", 0.0)


def test_a_transient_storage_fault_is_retried_and_then_read(prepared_dir, tmp_path, monkeypatch, no_waits):
    out = fresh_copy(prepared_dir, tmp_path)
    flaky = FlakyCopies(2, ConnectionResetError(104, "Connection reset by peer"))
    monkeypatch.setattr(paths, "local_copy", flaky)
    documents = prepared.PreparedDocuments(out)
    assert len(documents[0]) > 0 and flaky.calls >= 3


def test_a_lasting_storage_fault_is_raised_with_its_cause_not_named_damage(prepared_dir, tmp_path, monkeypatch,
                                                                           no_waits):
    from bert_jax.storage import retry

    out = fresh_copy(prepared_dir, tmp_path)
    fault = TimeoutError("the bucket did not answer")
    flaky = FlakyCopies(-1, fault)
    monkeypatch.setattr(paths, "local_copy", flaky)
    with pytest.raises(TimeoutError) as raised:
        prepared.PreparedDocuments(out)
    assert raised.value is fault and flaky.calls == retry.ATTEMPTS


def test_a_memory_error_passes_through_as_it_is(prepared_dir, tmp_path, monkeypatch):
    out = fresh_copy(prepared_dir, tmp_path)
    documents = prepared.PreparedDocuments(out)

    def out_of_memory(record):
        raise MemoryError()

    monkeypatch.setattr(prepared, "decode_document", out_of_memory)
    with pytest.raises(MemoryError):
        documents[0]
