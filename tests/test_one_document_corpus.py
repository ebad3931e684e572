"""A corpus that is one document (one sentence per line, no blank line: the `text` source ends a document at a blank
line) is refused where the run starts, in one line naming the file and the fix, before anything is written; as raw
text and as prepared shards alike (issue 69)."""
import pytest

import bert_jax
from bert_jax.train.config_validation import check_config
from data_pipelines.shards import prepare as prepare_lib
from test_pretrain import micro_config


def write_book(path, verses: int = 400):
    """One verse per line, no blank line: one document."""
    path.write_text("".join(f"Verse {v}: and the word {v % 17} was with the line {v * 3}.\n" for v in range(verses)))
    return path


def one_document_config(source: str, path) -> object:
    c = micro_config()
    c.data.source, c.data.path = source, str(path)
    c.data.tokenizer.min_frequency = 1
    return c


def test_a_one_document_text_corpus_is_refused_in_one_line_before_the_workdir_exists(tmp_path):
    book = write_book(tmp_path / "book.txt")
    workdir = tmp_path / "run"
    with pytest.raises(bert_jax.UserError) as refused:
        check_config(one_document_config("text", book), str(workdir))
    message = str(refused.value)
    assert "\n" not in message
    assert f"config.data.path='{book}' holds 1 document" in message
    assert "eval split none" in message and "blank line" in message and "split -l" in message
    assert not workdir.exists()


def test_a_one_document_prepared_corpus_is_refused_in_one_line_before_the_workdir_exists(tmp_path):
    book = write_book(tmp_path / "book.txt")
    out = tmp_path / "prepared"
    data = one_document_config("text", book).data
    prepare_lib.prepare(data, str(out), docs_per_shard=10)
    workdir = tmp_path / "run"
    with pytest.raises(bert_jax.UserError) as refused:
        check_config(one_document_config("prepared", out), str(workdir))
    message = str(refused.value)
    assert "\n" not in message
    assert f"config.data.path='{out}' holds 1 document" in message and "prepare it again" in message
    assert not workdir.exists()


def test_a_corpus_of_documents_passes_the_split_check(tmp_path):
    book = tmp_path / "books.txt"
    book.write_text("\n".join(f"Document {d} line one.\nDocument {d} line two.\n" for d in range(40)))
    check_config(one_document_config("text", book), str(tmp_path / "run"))
