"""Tokenizer kinds: training, save/load round trips, word starts, Hugging Face parity, config."""

import functools
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import tokenizers
from pydoc_data import topics as pydoc_topics

from data_pipelines.tokenizers import tokenizer as tokenizer_lib
from data_pipelines.tokenizers import training as tokenizer_training
from tests.test_data_sources import data_cfg

SENTENCE = "The function returns a list of values, sorted by their keys."


@functools.lru_cache(maxsize=1)
def sample_lines() -> tuple[str, ...]:
    """~200 KB of English prose that ships with Python (no download, no corpus build)."""
    lines = []
    for name in sorted(pydoc_topics.topics)[:60]:
        lines.extend(line.strip() for line in pydoc_topics.topics[name].splitlines() if line.strip())
    return tuple(lines)


def train(kind: str, vocab_size: int = 600):
    return tokenizer_lib.get_kind(kind).train(sample_lines(), vocab_size)


@functools.lru_cache(maxsize=None)
def trained(kind: str):
    return train(kind)


EXPECTED_SPECIALS = {
    "wordpiece": tokenizer_lib.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4),
    "bpe": tokenizer_lib.SpecialIds(pad=1, unk=3, cls=0, sep=2, mask=4),  # RoBERTa's order.
    "unigram": tokenizer_lib.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4),  # ALBERT's.
    "sentencepiece_bpe": tokenizer_lib.SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4),
}


@pytest.mark.parametrize("kind", tokenizer_lib.known_kinds())
def test_each_kind_trains_with_its_specials_and_round_trips_save_load(tmp_path, kind):
    tokenizer = trained(kind)
    assert tokenizer.kind == kind
    assert tokenizer_lib.special_ids(tokenizer) == EXPECTED_SPECIALS[kind]
    assert 300 < tokenizer.get_vocab_size() <= 600
    tokenizer.save(str(tmp_path))
    loaded = pickle.loads(pickle.dumps(tokenizer_lib.load_tokenizer(str(tmp_path))))
    assert loaded.kind == kind and loaded.get_vocab_size() == tokenizer.get_vocab_size()
    texts = [SENTENCE, "Another line; with punctuation!", ""]
    for got, want in zip(loaded.encode_ids(texts), tokenizer.encode_ids(texts)):
        assert got.dtype == np.int32 and np.array_equal(got, want)
    assert len(tokenizer.encode_ids([""])[0]) == 0
    assert np.array_equal(loaded.word_start_flags(), tokenizer.word_start_flags())


@pytest.mark.parametrize("kind", tokenizer_lib.known_kinds())
def test_word_start_flags_mark_exactly_the_first_piece_of_each_word(kind):
    tokenizer = trained(kind)
    flags = tokenizer.word_start_flags()
    assert flags.shape == (tokenizer.get_vocab_size(),) and flags.dtype == bool
    assert flags[list(tokenizer_lib.special_ids(tokenizer).all())].all()
    # "unreadability" is no token of a 600-entry vocabulary: it splits into several pieces.
    words = ["unreadability", "the", "sorted"]
    for word in words:
        (ids,) = tokenizer.encode_ids([word])
        assert len(ids) >= 1
        starts = flags[ids]  # SentencePiece may begin a rare word with a bare "▁": the start.
        assert starts[0] and not starts[1:].any(), [tokenizer.id_to_token(int(i)) for i in ids]
    (ids,) = tokenizer.encode_ids(["the unreadability"])
    assert flags[ids].sum() == 2


@pytest.mark.parametrize("kind", tokenizer_lib.known_kinds())
def test_transformers_auto_tokenizer_loads_the_saved_files_with_the_same_ids(tmp_path, kind):
    transformers = pytest.importorskip("transformers")
    tokenizer = trained(kind)
    tokenizer.save(str(tmp_path))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    (ids,) = tokenizer.encode_ids([SENTENCE])
    assert hf(SENTENCE, add_special_tokens=False)["input_ids"] == ids.tolist()
    specials = tokenizer_lib.special_ids(tokenizer)
    assert (hf.pad_token_id, hf.mask_token_id, hf.cls_token_id, hf.sep_token_id) == (
        specials.pad, specials.mask, specials.cls, specials.sep
    )


@pytest.mark.parametrize("kind", tokenizer_lib.known_kinds())
def test_fast_tokenizer_gives_the_kinds_ids_or_none_for_a_unigram_model(kind):
    tokenizer = trained(kind)
    fast = tokenizer.fast_tokenizer()
    if kind == "unigram":  # a bare SentencePiece model: no offsets, no word ids
        assert fast is None
        return
    (ids,) = tokenizer.encode_ids([SENTENCE])
    assert fast.encode(SENTENCE, add_special_tokens=False).ids == ids.tolist()


def test_vocab_txt_and_model_files_load_by_path(tmp_path):
    trained("wordpiece").save(str(tmp_path / "wp"))
    trained("unigram").save(str(tmp_path / "sp"))
    from_vocab = tokenizer_lib.load_tokenizer(str(tmp_path / "wp" / "vocab.txt"))
    assert from_vocab.kind == "wordpiece"
    assert np.array_equal(from_vocab.encode_ids([SENTENCE])[0], trained("wordpiece").encode_ids([SENTENCE])[0])
    from_model = tokenizer_lib.load_tokenizer(str(tmp_path / "sp" / "spiece.model"))
    assert from_model.kind == "unigram"
    assert np.array_equal(from_model.encode_ids([SENTENCE])[0], trained("unigram").encode_ids([SENTENCE])[0])
    with pytest.raises(FileNotFoundError, match="config.data.tokenizer.path='.*nope.model' does not exist"):
        tokenizer_lib.load_tokenizer(str(tmp_path / "nope.model"))


def test_configured_special_tokens_replace_the_kinds_defaults():
    specials = tokenizer_lib.parse_specials("wordpiece", "<p>,<u>,<c>,<s>,<m>")
    tokenizer = tokenizer_lib.get_kind("wordpiece").train(sample_lines()[:200], 300, specials=specials)
    assert tokenizer_lib.special_ids(tokenizer) == tokenizer_lib.SpecialIds(0, 1, 2, 3, 4)
    assert tokenizer.id_to_token(4) == "<m>"
    with pytest.raises(ValueError, match="special_tokens=.*five distinct names"):
        tokenizer_lib.parse_specials("wordpiece", "a,b,c")


def test_prepare_tokenizer_trains_on_a_capped_train_sample_then_reuses_it(tmp_path):
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n\n".join(sample_lines()))
    cfg = data_cfg(source="text", path=str(corpus_file), vocab_size=400)
    cfg.tokenizer.kind = "unigram"
    cfg.tokenizer.sample_bytes = 50_000
    sample = list(tokenizer_training.training_sample(cfg, 50_000, tokenizer_training.sources.SkipStats()))
    assert 50_000 <= sum(len(s.encode()) for s in sample) < 50_000 + max(len(s.encode()) for s in sample) + 1
    tokenizer = tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path / "tok"))
    assert tokenizer.kind == "unigram" and os.path.exists(tmp_path / "tok" / "spiece.model")
    cfg.tokenizer.kind = "wordpiece"  # The saved one wins: a resume never retrains.
    again = tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path / "tok"))
    assert again.kind == "unigram"
    assert np.array_equal(again.encode_ids([SENTENCE])[0], tokenizer.encode_ids([SENTENCE])[0])


def test_prepare_tokenizer_copies_a_configured_path(tmp_path):
    trained("bpe").save(str(tmp_path / "given"))
    cfg = data_cfg(source="text", path=str(tmp_path))
    cfg.tokenizer.path = str(tmp_path / "given")
    tokenizer = tokenizer_lib.prepare_tokenizer(cfg, str(tmp_path / "run_tok"))
    assert tokenizer.kind == "bpe" and os.path.exists(tmp_path / "run_tok" / "merges.txt")


def test_command_line_trains_the_configured_kind(tmp_path):
    corpus_file = tmp_path / "corpus.txt"
    corpus_file.write_text("\n".join(sample_lines()[:2000]))
    out = tmp_path / "tok"
    subprocess.run(
        [
            sys.executable, "-m", "bert_jax.commands.tokenizer", "--config=configs/tiny.py", f"--out={out}",
            "--config.data.source=text", f"--config.data.path={corpus_file}",
            "--config.data.tokenizer.kind=sentencepiece_bpe", "--config.model.vocab_size=500",
        ],
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True,
    )
    tokenizer = tokenizer_lib.load_tokenizer(str(out))
    assert tokenizer.kind == "sentencepiece_bpe" and tokenizer.get_vocab_size() == 500


def test_a_tokenizer_json_that_pads_and_truncates_gives_texts_whole(tmp_path):
    """Released tokenizer.json files may pad and truncate every text (all-MiniLM-L6-v2's: to 128)."""
    wordpiece = trained("wordpiece")
    wordpiece.save(str(tmp_path))
    whole = wordpiece.encode_ids([SENTENCE])[0]
    hf = tokenizers.Tokenizer.from_str(wordpiece.hf.to_str())
    hf.enable_padding(length=len(whole) + 20, pad_id=0)
    hf.enable_truncation(max_length=3)
    (tmp_path / "tokenizer.json").write_text(hf.to_str())
    loaded = tokenizer_lib.load_tokenizer(str(tmp_path))
    assert np.array_equal(loaded.encode_ids([SENTENCE])[0], whole)
