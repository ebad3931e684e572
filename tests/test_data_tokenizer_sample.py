"""The tokenizer's sample represents the corpus: every file by its size, files drawn by seed, mixture
sources by weight, and tokenizer/sample.json says which files gave how many bytes."""

import json

import pytest

from data_pipelines.sources import documents as sources
from data_pipelines.tokenizers import sample as sample_lib
from data_pipelines.tokenizers import tokenizer as tokenizer_lib
from data_pipelines.tokenizers import training as tokenizer_training
from tests.test_data_sources import data_cfg

LAND = ("river", "mountain", "forest", "valley", "meadow", "glacier", "canyon", "prairie")
MACHINE = ("engine", "circuit", "voltage", "turbine", "piston", "gearbox", "dynamo", "sensor")


def _write_half(directory, words, files, documents):
    directory.mkdir(parents=True)
    for f in range(files):
        text = "\n\n".join(" ".join(words[(d + k) % len(words)] for k in range(40)) for d in range(documents))
        (directory / f"part{f}.txt").write_text(text)


@pytest.fixture(scope="module")
def halves(tmp_path_factory):
    """a/ (land words, 4 files, ~100 KB) sorts before b/ (machine words, 2 files, ~50 KB)."""
    root = tmp_path_factory.mktemp("halves")
    _write_half(root / "a", LAND, files=4, documents=80)
    _write_half(root / "b", MACHINE, files=2, documents=80)
    return root


def test_a_sample_smaller_than_the_first_half_still_learns_both_halves(halves, tmp_path):
    cfg = data_cfg(source="text", path=str(halves), vocab_size=200, eval_fraction=0.0)
    cfg.tokenizer.min_frequency = 1
    cfg.tokenizer.sample_bytes = 30_000  # the first half alone holds ~100 KB
    tokenizer = tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path / "tok"))
    for word in LAND + MACHINE:
        assert tokenizer.token_to_id(word) is not None, word
    record = json.loads((tmp_path / "tok" / tokenizer_lib.SAMPLE_FILE).read_text())
    assert sorted(record["files"]) == sorted(str(p) for p in halves.glob("*/*.txt"))
    by_half = {h: sum(b for f, b in record["files"].items() if f"/{h}/" in f) for h in "ab"}
    assert by_half["a"] / record["bytes"] == pytest.approx(2 / 3, abs=0.05)  # each file by its size
    assert record["bytes"] == sum(record["files"].values()) and record["sample_seed"] == 0


def test_small_shares_pool_into_a_seeded_subset_of_files():
    sizes = [1_000] * 1_000
    shares = sample_lib.file_shares(sizes, 64_000, seed=0)
    chosen = [i for i, share in shares if share > 0]
    assert 60 <= len(chosen) <= 70 and sum(s for _, s in shares) == pytest.approx(64_000)
    assert max(chosen) > 900 and min(chosen) < 100  # spread over the corpus, not its first files
    other = [i for i, share in sample_lib.file_shares(sizes, 64_000, seed=1) if share > 0]
    assert other != chosen


def test_a_mixture_sample_gives_each_source_its_weight(halves, tmp_path):
    cfg = data_cfg(source="text", path=str(halves), vocab_size=200, eval_fraction=0.0)
    cfg.mixture = dict(land=dict(source="text", path=str(halves / "a"), weight=0.25),
                       machines=dict(source="text", path=str(halves / "b"), weight=0.75))
    cfg.tokenizer.sample_bytes = 20_000
    _, record = tokenizer_training.train_from_config(cfg)
    assert set(record.sources) == {"land", "machines"}
    assert record.sources["land"] / record.bytes == pytest.approx(0.25, abs=0.03)


def test_a_tfds_source_is_drawn_by_seed_and_gives_a_mixture_its_share(halves, tmp_path):
    """TFDS (random access) gives whole documents in a seeded order, not its first ones; in a mixture, its
    weight's share of the bytes, recorded under its name."""
    from tests.test_data_sources import _tiny_tfds  # noqa: PLC0415 (skips without tensorflow_datasets)

    tfds_dir = str(tmp_path / "tfds")
    name = _tiny_tfds(tmp_path / "tfds")
    tfds = dict(source="tfds", tfds_name=name, tfds_split="train", tfds_data_dir=tfds_dir)
    cfg = data_cfg(**tfds, eval_fraction=0.0)
    first = {next(sample_lib.sample_segments(cfg, 20, seed, sources.SkipStats()))[2] for seed in range(5)}
    assert len(first) > 1, first  # each seed its own first document
    mixed = data_cfg(source="text", path=str(halves), vocab_size=200, eval_fraction=0.0)
    mixed.mixture = dict(land=dict(source="text", path=str(halves / "a"), weight=0.5),
                         docs=dict(**tfds, weight=0.5))
    mixed.tokenizer.sample_bytes = 200
    _, record = tokenizer_training.train_from_config(mixed)
    assert set(record.sources) == {"land", "docs"} and record.sources["docs"] >= 100
