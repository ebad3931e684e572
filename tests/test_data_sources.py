"""Sources: every kind yields the documents its files hold; shards split them; start resumes."""

import gzip
import json

import ml_collections
import pytest

from bert_jax.configs import base
from data_pipelines.sources import segmenters, documents as sources


def data_cfg(**overrides) -> ml_collections.ConfigDict:
    cfg = base.get_config().data
    for key, value in overrides.items():
        cfg[key] = value
    return cfg


def documents(cfg, **kwargs):
    stats = sources.SkipStats()
    return list(sources.iter_documents(cfg, stats=stats, **kwargs)), stats


TEXT = "Alpha one.\nAlpha two.\n\nBeta one. Beta two!\n\n\nGamma one.\n"


def test_text_files_split_into_documents_at_blank_lines(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    docs, stats = documents(data_cfg(source="text", path=str(tmp_path / "a.txt")))
    assert docs == [["Alpha one.", "Alpha two."], ["Beta one. Beta two!"], ["Gamma one."]]
    assert stats.as_dict() == {}


def test_sentence_segmenter_splits_lines_into_sentences(tmp_path):
    (tmp_path / "a.txt").write_text(TEXT)
    docs, _ = documents(data_cfg(source="text", path=str(tmp_path / "a.txt"), segmenter="sentence"))
    assert docs[1] == ["Beta one.", "Beta two!"]


def test_blank_line_segmenter_makes_paragraphs_and_two_blank_lines_end_a_document(tmp_path):
    (tmp_path / "a.txt").write_text("P one\nstill one.\n\nP two.\n\n\nNext doc.\n")
    docs, _ = documents(data_cfg(source="text", path=str(tmp_path / "a.txt"), segmenter="blank_line"))
    assert docs == [["P one still one.", "P two."], ["Next doc."]]


def test_split_text_rules():
    text = "First line. Second sentence.\nThird line\n\n  Para two  "
    assert segmenters.split_text(text, "line") == ["First line. Second sentence.", "Third line", "Para two"]
    assert segmenters.split_text(text, "sentence") == [
        "First line.", "Second sentence.", "Third line", "Para two"
    ]
    assert segmenters.split_text(text, "blank_line") == [
        "First line. Second sentence. Third line", "Para two"
    ]
    with pytest.raises(ValueError, match="config.data.segmenter='words'"):
        segmenters.split_text(text, "words")


def test_directory_glob_and_gzip_read_the_same_documents(tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "a.txt").write_text("A1.\nA2.\n")
    with gzip.open(tmp_path / "dir" / "b.txt.gz", "wt") as f:
        f.write("B1.\nB2.\n")
    (tmp_path / "dir" / ".hidden").write_text("never read\n")
    by_dir, _ = documents(data_cfg(source="text", path=str(tmp_path / "dir")))
    by_glob, _ = documents(data_cfg(source="text", path=str(tmp_path / "dir" / "*.txt*")))
    assert by_dir == by_glob == [["A1.", "A2."], ["B1.", "B2."]]


def test_jsonl_field_is_one_document(tmp_path):
    rows = [{"text": "One. Two.\nThree.", "id": 1}, {"text": "Four.", "id": 2}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    docs, _ = documents(data_cfg(source="jsonl", path=str(tmp_path / "d.jsonl")))
    assert docs == [["One. Two.", "Three."], ["Four."]]
    body, _ = documents(data_cfg(source="jsonl", path=str(tmp_path / "d.jsonl"), field="id"))
    assert body == []  # Not text: skipped (and counted, see test_data_bad_input).


def test_parquet_column_is_read_in_record_batches(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    texts = [f"Doc {i} first.\nDoc {i} second." for i in range(2500)]
    table = pa.table({"body": texts, "n": list(range(2500))})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=1000)
    docs, _ = documents(data_cfg(source="parquet", path=str(tmp_path / "d.parquet"), field="body"))
    assert len(docs) == 2500
    assert docs[1234] == ["Doc 1234 first.", "Doc 1234 second."]


def _tiny_text_builder():
    """Defined once per process: TFDS registers a builder class by name and refuses a second class named so
    (pytest may import this module twice, as a test file and from another test)."""
    tfds = pytest.importorskip("tensorflow_datasets")
    if "tiny_text" in tfds.list_builders(with_community_datasets=False):
        return tfds.builder_cls("tiny_text")

    class TinyText(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()})
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for i in range(6):
                yield i, {"text": f"Doc {i} first.\nDoc {i} second."}

    return TinyText


def _tiny_tfds(data_dir):
    # ArrayRecord: readable by tfds.data_source without TensorFlow.
    _tiny_text_builder()(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return "tiny_text"


def test_tfds_array_record_dataset_is_random_access_documents(tmp_path):
    name = _tiny_tfds(tmp_path / "tfds")
    cfg = data_cfg(source="tfds", tfds_name=name, tfds_split="train", tfds_data_dir=str(tmp_path / "tfds"))
    assert sources.is_random_access(cfg)
    table = sources.open_random_access(cfg)
    assert len(table) == 6
    expected = sorted([f"Doc {i} first.", f"Doc {i} second."] for i in range(6))
    assert sorted(table[i] for i in range(6)) == expected
    streamed, _ = documents(cfg)
    assert sorted(streamed) == expected
    halves = [documents(cfg, shard_index=i, shard_count=2)[0] for i in range(2)]
    assert [len(h) for h in halves] == [3, 3] and sorted(halves[0] + halves[1]) == expected


def test_missing_tfds_dataset_is_named(tmp_path):
    cfg = data_cfg(source="tfds", tfds_name="no_such_dataset", tfds_data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="config.data.tfds_name='no_such_dataset'"):
        sources.open_random_access(cfg)


def _numbered_files(tmp_path, num_files, docs_per_file):
    for f in range(num_files):
        body = "".join(f"File {f} doc {d} a.\nFile {f} doc {d} b.\n\n" for d in range(docs_per_file))
        (tmp_path / f"f{f}.txt").write_text(body)
    return data_cfg(source="text", path=str(tmp_path / "*.txt"))


@pytest.mark.parametrize("num_files", [5, 2])  # By whole files; by every n-th document.
def test_shards_are_disjoint_and_together_cover_the_source(tmp_path, num_files):
    cfg = _numbered_files(tmp_path, num_files, 7)
    everything, _ = documents(cfg)
    shares = [documents(cfg, shard_index=i, shard_count=3)[0] for i in range(3)]
    flat = [tuple(d) for share in shares for d in share]
    assert len(flat) == len(set(flat)) == len(everything)
    assert set(flat) == {tuple(d) for d in everything}
    assert all(shares)


def test_one_parquet_file_is_shared_out_by_row_groups(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [f"Doc {i}." for i in range(40)]}), tmp_path / "d.parquet", row_group_size=10)
    cfg = data_cfg(source="parquet", path=str(tmp_path / "d.parquet"))
    shares = [documents(cfg, shard_index=i, shard_count=3)[0] for i in range(3)]
    # Row groups 0 and 3 to shard 0, 1 to shard 1, 2 to shard 2: whole groups, not every 3rd row.
    assert [len(s) for s in shares] == [20, 10, 10]
    assert sorted(d[0] for s in shares for d in s) == sorted(f"Doc {i}." for i in range(40))
    assert shares[1][0] == ["Doc 10."]


def test_fewer_files_than_shards_count_each_bad_record_once(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"Good.\n\xff bad\n\nMore.\n")
    cfg = data_cfg(source="text", path=str(tmp_path / "a.txt"))
    counts = [documents(cfg, shard_index=i, shard_count=2)[1].as_dict() for i in range(2)]
    assert counts == [{"invalid_utf8": 1}, {}]


def test_start_resumes_the_shard_where_it_stopped(tmp_path):
    cfg = _numbered_files(tmp_path, 4, 5)
    full, _ = documents(cfg, shard_index=1, shard_count=2)
    resumed, _ = documents(cfg, shard_index=1, shard_count=2, start=3)
    assert resumed == full[3:]


def test_random_access_is_only_offered_by_table_sources(tmp_path):
    (tmp_path / "a.txt").write_text("x\n")
    cfg = data_cfg(source="text", path=str(tmp_path / "a.txt"))
    assert not sources.is_random_access(cfg)
    with pytest.raises(ValueError, match="is a stream"):
        sources.open_random_access(cfg)
    with pytest.raises(ValueError, match="config.data.source='csv'"):
        sources.is_random_access(data_cfg(source="csv"))


def test_embedded_source_streams_and_serves_random_access():
    cfg = data_cfg(source="embedded")
    table = sources.open_random_access(cfg)
    streamed, _ = documents(cfg, shard_index=1, shard_count=2)
    assert streamed == [table[i] for i in range(1, len(table), 2)]


def test_skip_stats_merge_and_log_line():
    stats = sources.SkipStats()
    stats.skip("invalid_utf8")
    stats.merge({"invalid_utf8": 2, "empty_file": 1})
    assert stats.as_dict() == {"empty_file": 1, "invalid_utf8": 3}
    assert stats.log_line() == "skipped 4 record(s): empty_file=1, invalid_utf8=3"
