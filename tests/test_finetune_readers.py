"""Every format of config.data.format reads the same data into the same rows as the CSV reader, and a row that
cannot be read fails naming its file and line (a stray delimiter would otherwise shift a text into the label)."""
import json

import pytest

import bert_jax.configs.finetune.classification
import bert_jax.configs.finetune.regression
import finetune_data as fd
from bert_jax.finetune.splits import read_splits

# Texts a CSV must quote (a comma, quotes) and a TSV must keep verbatim: TSV has no quoting (GLUE's files leave
# quotes bare, and BERT's run_classifier reads them with quotechar=None).
AWKWARD = [{"sentence": 'he said "good", then left', "label": "pos", "score": "0.9"},
           {"sentence": '" bad start', "label": "neg", "score": "0.1"}]


@pytest.fixture(scope="module")
def rows() -> dict:
    return {"train": fd.sentiment_rows(12, 0) + AWKWARD, "validation": fd.sentiment_rows(6, 1)}


def write_tsv(path, rows: list[dict], fields=("sentence", "label", "score")) -> str:
    path.write_text("".join("\t".join(line) + "\n" for line in [fields] + [[r[f] for f in fields] for r in rows]))
    return str(path)


def write_jsonl(path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


WRITERS = {"csv": fd.write_csv, "tsv": write_tsv, "jsonl": write_jsonl}


def splits_of(config, fmt: str, files: dict) -> dict:
    config.data.format = fmt
    config.data.train, config.data.validation = files["train"], files["validation"]
    return {name: split.rows for name, split in read_splits(config.data, config.task).items()}


@pytest.mark.parametrize("fmt", ["tsv", "jsonl"])
@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_tsv_and_jsonl_give_the_csv_readers_rows(fmt, kind, rows, tmp_path):
    config = {"classification": bert_jax.configs.finetune.classification,
              "regression": bert_jax.configs.finetune.regression}[kind].get_config()
    if kind == "regression":
        config.task.text_fields, config.task.label_field = "sentence", "score"
    files = {fmt_: {split: WRITERS[fmt_](tmp_path / f"{split}.{fmt_}", r) for split, r in rows.items()}
             for fmt_ in ("csv", fmt)}
    expected = splits_of(config, "csv", files["csv"])
    assert [r["texts"][0] for r in expected["train"][-2:]] == [r["sentence"] for r in AWKWARD]
    assert splits_of(config, fmt, files[fmt]) == expected


def test_jsonl_numbers_read_as_the_csv_readers_strings(tmp_path):
    """JSON gives a score as a number where CSV gives a string: a regression row gets the same float."""
    config = bert_jax.configs.finetune.regression.get_config()
    config.task.text_fields, config.task.label_field = "sentence", "score"
    rows = fd.sentiment_rows(6, 0)
    typed = [{**r, "score": float(r["score"])} for r in rows]
    files = {"csv": {s: fd.write_csv(tmp_path / f"{s}.csv", rows) for s in ("train", "validation")},
             "jsonl": {s: write_jsonl(tmp_path / f"{s}.jsonl", typed) for s in ("train", "validation")}}
    assert splits_of(config, "jsonl", files["jsonl"]) == splits_of(config, "csv", files["csv"])


@pytest.mark.parametrize("fmt, bad_line, culprit", [
    pytest.param("csv", "good fine, and more,pos,0.9", r"4 fields where its header has 3", id="csv-unquoted-comma"),
    pytest.param("tsv", "good fine\tand more\tpos\t0.9", r"4 fields where its header has 3", id="tsv-tab-in-text"),
    pytest.param("jsonl", '{"sentence": "good fine", "label": "pos"', r"not a JSON object", id="jsonl-cut-short"),
    pytest.param("jsonl", '["good fine", "pos"]', r"not a JSON object", id="jsonl-a-list"),
])
def test_a_row_that_cannot_be_read_fails_naming_file_and_line(fmt, bad_line, culprit, tmp_path):
    config = bert_jax.configs.finetune.classification.get_config()
    path = tmp_path / f"train.{fmt}"
    WRITERS[fmt](path, fd.sentiment_rows(4, 0))
    lines = path.read_text().splitlines()
    bad_number = 3 if fmt != "jsonl" else 2  # after the header (if any) and a good row
    lines.insert(bad_number - 1, bad_line)
    path.write_text("\n".join(lines) + "\n")
    config.data.format, config.data.train = fmt, str(path)
    with pytest.raises(ValueError, match=rf"{path}, line {bad_number}: .*{culprit}"):
        read_splits(config.data, config.task)


def build_tiny_tfds(data_dir, rows: dict) -> str:
    """A TFDS dataset of the rows (text features), built by tensorflow-datasets' own builder as ArrayRecord files,
    which tfds.data_source reads without TensorFlow; nothing is downloaded."""
    tfds = pytest.importorskip("tensorflow_datasets")

    class TinySentimentPairs(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
                {"sentence": tfds.features.Text(), "label": tfds.features.Text(), "score": tfds.features.Text()}))

        def _split_generators(self, dl_manager):
            return {split: self._generate_examples(r) for split, r in rows.items()}

        def _generate_examples(self, split_rows):
            for i, row in enumerate(split_rows):
                yield i, row

    TinySentimentPairs(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return "tiny_sentiment_pairs"


def test_a_tfds_dataset_gives_the_csv_readers_rows(rows, tmp_path):
    config = bert_jax.configs.finetune.classification.get_config()
    expected = splits_of(config, "csv", {s: fd.write_csv(tmp_path / f"{s}.csv", r) for s, r in rows.items()})
    config.data.tfds_name = build_tiny_tfds(tmp_path / "tfds", rows)
    config.data.tfds_data_dir = str(tmp_path / "tfds")
    got = splits_of(config, "tfds", {"train": "train", "validation": "validation"})
    # TFDS stores examples in the order of their keys' hashes: the same rows, in another order.
    key = lambda row: json.dumps(row, sort_keys=True)  # noqa: E731
    assert {s: sorted(r, key=key) for s, r in got.items()} == {s: sorted(r, key=key) for s, r in expected.items()}
    assert len(got["train"]) == len(rows["train"])

