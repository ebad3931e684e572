"""Bad input: each kind of bad record is skipped and counted by reason; bad config fails at start."""

import gzip
import json

import pytest

from data_pipelines.sources import documents as sources
from tests.test_data_sources import data_cfg, documents


def text_cfg(path):
    return data_cfg(source="text", path=str(path))


def test_invalid_utf8_line_is_skipped_and_counted_and_the_rest_kept(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"Good one.\nBad \xff\xfe line.\nGood two.\n")
    docs, stats = documents(text_cfg(tmp_path / "a.txt"))
    assert docs == [["Good one.", "Good two."]]
    assert stats.as_dict() == {"invalid_utf8": 1}


def test_nul_and_control_bytes_in_a_line_are_skipped_and_counted(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"Good.\n" * 2000 + b"Has \x00 NUL.\nHas \x07 bell.\nTabs\tare fine.\n")
    docs, stats = documents(text_cfg(tmp_path / "a.txt"))
    assert docs[0][-1] == "Tabs\tare fine." and len(docs[0]) == 2001
    assert stats.as_dict() == {"control_characters": 2}


def test_binary_and_empty_files_are_skipped_and_counted(tmp_path):
    (tmp_path / "a.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "b.txt").write_bytes(b"")
    (tmp_path / "c.txt").write_text("Kept.\n")
    with gzip.open(tmp_path / "d.txt.gz", "wb"):
        pass  # An empty gzip member: empty once decompressed.
    docs, stats = documents(data_cfg(source="text", path=str(tmp_path)))
    assert docs == [["Kept."]]
    assert stats.as_dict() == {"binary_file": 1, "empty_file": 2}


def test_truncated_gzip_keeps_what_was_read_and_counts_the_file(tmp_path):
    data = gzip.compress(("Line of text.\n" * 5000).encode())
    (tmp_path / "a.txt.gz").write_bytes(data[: len(data) // 2])
    (tmp_path / "b.txt").write_text("After.\n")
    docs, stats = documents(data_cfg(source="text", path=str(tmp_path)))
    assert docs[-1] == ["After."] and len(docs) == 2
    assert stats.as_dict() == {"unreadable_file": 1}


def test_ten_megabyte_line_is_skipped_and_counted_not_truncated(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"Before.\n" + b"word " * 2_000_000 + b"\nAfter.\n")
    docs, stats = documents(text_cfg(tmp_path / "a.txt"))
    assert docs == [["Before.", "After."]]
    assert stats.as_dict() == {"line_too_long": 1}


def test_bad_jsonl_records_are_skipped_by_reason(tmp_path):
    lines = [
        json.dumps({"text": "Good."}),
        "{not json",
        json.dumps({"other": "no text field"}),
        json.dumps({"text": None}),
        json.dumps({"text": "   \n  "}),
        json.dumps({"text": "NUL \u0000 inside"}),
        json.dumps({"text": "x" * 2000}),
        "",
        json.dumps({"text": "Also good."}),
    ]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    cfg = data_cfg(source="jsonl", path=str(tmp_path / "d.jsonl"), max_line_bytes=1000)
    docs, stats = documents(cfg)
    assert docs == [["Good."], ["Also good."]]
    assert stats.as_dict() == {
        "control_characters": 1,
        "empty_document": 1,
        "invalid_json": 1,
        "line_too_long": 1,
        "missing_field": 2,
    }


def test_null_and_empty_parquet_cells_are_counted(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["Good.", None, "", "Fine."]}), tmp_path / "d.parquet")
    docs, stats = documents(data_cfg(source="parquet", path=str(tmp_path / "d.parquet")))
    assert docs == [["Good."], ["Fine."]]
    assert stats.as_dict() == {"empty_document": 1, "missing_field": 1}


def test_missing_parquet_column_fails_at_start_naming_the_key(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "d.parquet")
    with pytest.raises(ValueError, match=r"config.data.field='text' is not a column .*\['body'\]"):
        sources.iter_documents(data_cfg(source="parquet", path=str(tmp_path / "d.parquet")))


@pytest.mark.parametrize(
    "relative, message",
    [
        ("missing.txt", r"config.data.path='.*missing.txt' does not exist"),
        ("*.nothing", r"config.data.path='.*\*.nothing': the glob matches no files"),
        ("empty_dir", r"config.data.path='.*empty_dir' is a directory with no files"),
    ],
)
def test_missing_path_fails_when_the_stream_is_opened(tmp_path, relative, message):
    (tmp_path / "empty_dir").mkdir()
    # iter_documents raises at the call, before any document is requested.
    with pytest.raises(FileNotFoundError, match=message):
        sources.iter_documents(text_cfg(tmp_path / relative))


def test_empty_path_is_named():
    with pytest.raises(ValueError, match="config.data.path is empty"):
        sources.iter_documents(data_cfg(source="jsonl", path=""))


def test_single_segment_documents_are_kept_for_the_builders(tmp_path):
    (tmp_path / "a.txt").write_text("Only one.\n\nTwo here.\nYes.\n")
    docs, stats = documents(text_cfg(tmp_path / "a.txt"))
    assert docs == [["Only one."], ["Two here.", "Yes."]]
    assert stats.as_dict() == {}
