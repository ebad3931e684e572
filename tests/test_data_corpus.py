"""The embedded corpus, the train/eval split and the WordPiece tokenizer."""

import collections
import os
import subprocess
import sys

import numpy as np
import pytest
import tokenizers

from data_pipelines.sources import corpus
from data_pipelines.tokenizers import tokenizer as tokenizer_lib
from data_pipelines.tokenizers import wordpiece


def test_segments_are_prose_sentences_without_code_or_rules():
    text = (
        "The \"assert\" statement\n"
        "**********************\n\n"
        "Assert statements are handy.  They   check\nthings! Really? Yes.\n\n"
        "   assert_stmt ::= \"assert\" expression\n\n"
        ">>> assert True\n\n"
        "e.g. lower case stays joined."
    )
    assert corpus.text_to_segments(text) == [
        'The "assert" statement',
        "Assert statements are handy.",
        "They check things!",
        "Really?",
        "Yes.",
        "e.g. lower case stays joined.",
    ]


def test_stdlib_reader_skips_tests_and_counts_broken_files(tmp_path):
    (tmp_path / "good.py").write_text(
        '"""Module doc.  Second sentence."""\ndef f():\n    """F doc."""\n'
    )
    (tmp_path / "broken.py").write_text('"""Doc."""\ndef (:\n')
    (tmp_path / "nodoc.py").write_text("x = 1\n")
    (tmp_path / "latin.py").write_bytes(b'"""caf\xe9."""\n')
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "t.py").write_text('"""Test doc."""\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text('"""Pkg doc."""\n')
    skipped = collections.Counter()
    documents = list(corpus.stdlib_docstring_documents(None, skipped, stdlib_dir=str(tmp_path)))
    assert documents == [["Module doc.", "Second sentence.", "F doc."], ["Pkg doc."]]
    assert skipped == {
        "syntax_error": 1, "no_docstrings": 1, "unreadable": 1, "over_parse_budget": 0
    }


def test_parse_budget_bounds_the_files_read(tmp_path):
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.py").write_text(f'"""Doc {name}."""\n' + "x = 1\n" * 100)
    skipped = collections.Counter()
    documents = list(corpus.stdlib_docstring_documents(700, skipped, stdlib_dir=str(tmp_path)))
    assert len(documents) == 1 and skipped["over_parse_budget"] == 2


def test_embedded_corpus_is_large_deterministic_and_clean():
    documents = list(corpus.embedded_documents())
    assert documents == list(corpus.embedded_documents())
    segments = [s for d in documents for s in d]
    assert len(documents) > 300
    assert sum(len(s) for s in segments) > 1_000_000
    assert all(s and s == " ".join(s.split()) for s in segments)


def test_eval_split_is_a_stable_hash_of_the_index():
    held_out = [corpus.is_eval_document(i, 0.05) for i in range(100_000)]
    assert np.mean(held_out) == pytest.approx(0.05, abs=0.005)
    assert held_out == [corpus.is_eval_document(i, 0.05) for i in range(100_000)]
    assert not any(corpus.is_eval_document(i, 0.0) for i in range(1000))
    with pytest.raises(ValueError, match="eval_fraction=1.5"):
        corpus.is_eval_document(0, 1.5)


TEXTS = ["The quick brown fox jumps over the lazy dog.", "A dog sleeps; the fox runs."] * 50


def test_trained_tokenizer_puts_specials_first_and_round_trips(tmp_path):
    tokenizer = wordpiece.train_wordpiece(TEXTS, vocab_size=120, min_frequency=1)
    assert tokenizer_lib.special_ids(tokenizer) == tokenizer_lib.SpecialIds(0, 1, 2, 3, 4)
    tokenizer_lib.save_tokenizer(tokenizer, str(tmp_path / "full"))
    lines = (tmp_path / "full" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(lines) == tokenizer.get_vocab_size()
    os.makedirs(tmp_path / "vocab_only")
    os.rename(tmp_path / "full" / "vocab.txt", tmp_path / "vocab_only" / "vocab.txt")
    text = "The LAZY fox, jumping!"
    expected = tokenizer.hf.encode(text, "a dog")
    for directory in ("full", "vocab_only"):
        loaded = tokenizer_lib.load_tokenizer(str(tmp_path / directory))
        encoding = loaded.hf.encode(text, "a dog")
        assert encoding.ids == expected.ids and encoding.type_ids == expected.type_ids
    assert expected.tokens[0] == "[CLS]" and expected.tokens[-1] == "[SEP]"


def test_missing_special_token_is_named():
    tokenizer = wordpiece.train_wordpiece(TEXTS, vocab_size=120, min_frequency=1)
    kept = [t for t in sorted(tokenizer.hf.get_vocab()) if t != "[MASK]"]
    without_mask = tokenizers.Tokenizer(
        tokenizers.models.WordPiece({t: i for i, t in enumerate(kept)}, unk_token="[UNK]")
    )
    with pytest.raises(ValueError, match=r"\[MASK\]"):
        tokenizer_lib.special_ids(without_mask)


def test_loading_an_empty_directory_names_the_files_sought(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json nor vocab.txt"):
        tokenizer_lib.load_tokenizer(str(tmp_path))


def test_command_line_trains_on_the_embedded_corpus(tmp_path):
    out = tmp_path / "tok"
    subprocess.run(
        [sys.executable, "-m", "bert_jax.commands.tokenizer", f"--out={out}", "--vocab_size=1000"],
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True,
    )
    tokenizer = tokenizer_lib.load_tokenizer(str(out))
    assert tokenizer.get_vocab_size() == 1000
    (ids,) = tokenizer.encode_ids(["The function returns a list"])
    assert [tokenizer.id_to_token(int(i)) for i in ids] == ["the", "function", "returns", "a", "list"]
