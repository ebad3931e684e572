"""Tokenizer training is a function of its sample and settings: same bytes in any process."""
import hashlib
import json
import logging
import os
import subprocess
import sys

import pytest

from data_pipelines.tokenizers import tokenizer as tokenizer_lib
from data_pipelines.tokenizers import training as tokenizer_training
from tests.test_data_sources import data_cfg
from tests.test_data_tokenizer import sample_lines, trained

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Trains every kind on the same ~250 KB sample (vocabulary 600) and saves each under argv[1].
_TRAIN_EVERY_KIND = """
import sys
from data_pipelines.tokenizers import tokenizer as tokenizer_lib
from tests.test_data_tokenizer import train
for kind in tokenizer_lib.known_kinds():
    train(kind).save(f"{sys.argv[1]}/{kind}")
"""


def _files(directory) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_each_kind_trains_byte_identical_files_in_processes_with_other_hash_seeds_and_threads(tmp_path):
    outputs = []
    for seed, threads in (("1", "1"), ("2", "2")):
        out = tmp_path / f"seed{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed, "RAYON_NUM_THREADS": threads, "PYTHONPATH": REPO}
        subprocess.run([sys.executable, "-c", _TRAIN_EVERY_KIND, str(out)], cwd=REPO, env=env, check=True)
        outputs.append(_files(out))
    assert {name.split("/")[0] for name in outputs[0]} == set(tokenizer_lib.known_kinds())
    assert outputs[0].keys() == outputs[1].keys()
    differing = [name for name in outputs[0] if outputs[0][name] != outputs[1][name]]
    assert not differing


def test_wordpiece_ids_run_specials_then_characters_then_continuations_then_merges():
    tokenizer = trained("wordpiece")
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.get_vocab_size())]
    assert tokens[:5] == list(tokenizer.specials.all())
    characters = [t for t in tokens if len(t) == 1]
    continuations = [t for t in tokens if len(t) == 3 and t.startswith("##")]
    assert tokens[5:5 + len(characters) + len(continuations)] == sorted(characters) + sorted(continuations)
    learned = tokens[5 + len(characters) + len(continuations):]
    assert learned and all(len(t.removeprefix("##")) >= 2 for t in learned)


def test_prepare_tokenizer_records_the_sample_it_trained_on(tmp_path):
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n\n".join(sample_lines()[:1500]))
    cfg = data_cfg(source="text", path=str(corpus_file), vocab_size=400, eval_fraction=0.0)
    tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path / "tok"))
    record = json.loads((tmp_path / "tok" / tokenizer_lib.SAMPLE_FILE).read_text())
    segments = sample_lines()[:1500]  # one document per line (blank lines between), none held out
    assert record["bytes"] == sum(len(s.encode()) for s in segments)
    assert record["segments"] == len(segments)
    assert record["sha256"] == hashlib.sha256(b"".join(s.encode() + b"\n" for s in segments)).hexdigest()
    assert (record["vocab_size_asked"], record["vocab_size"]) == (400, 400)
    # The record is no part of the tokenizer: copying the files elsewhere keeps the hash.
    copy = tokenizer_lib.load_tokenizer(str(tmp_path / "tok"))
    copy.save(str(tmp_path / "copy"))
    assert tokenizer_lib.tokenizer_hash(str(tmp_path / "copy")) == tokenizer_lib.tokenizer_hash(str(tmp_path / "tok"))


@pytest.mark.parametrize("kind", ["wordpiece", "unigram"])
def test_a_sample_too_small_for_the_vocabulary_warns_naming_both_sizes(tmp_path, caplog, kind):
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(sample_lines()[:40]))
    cfg = data_cfg(source="text", path=str(corpus_file), vocab_size=5000, eval_fraction=0.0)
    cfg.tokenizer.kind = kind
    with caplog.at_level(logging.WARNING):
        tokenizer, record = tokenizer_training.train_from_config(cfg)
    assert record.vocab_size == tokenizer.get_vocab_size() < 5000
    assert f"config.data.vocab_size=5000 but the {kind} tokenizer" in caplog.text
    assert f"has only {record.vocab_size} tokens" in caplog.text
