"""document_records: batch tokenization gives exactly the records of per-segment encoding."""

import json

import numpy as np
import pytest
import tokenizers

from data_pipelines.sources import prepared
from data_pipelines.tokenizers import extension as tokenizer_extension
from data_pipelines.shards.document_records import DocumentTokenizer
from data_pipelines.tokenizers.kinds import HfTokenizer, SpecialTokens
from tests.test_data_tokenizer import trained

TRICKY_DOCUMENTS = [
    ["The function returns a list of values.", "Sorted by their KEYS, in order."],
    ["Café Über naïve résumé — “quoted” text.", "Tabs\tand\u00a0nbsp and 中文字符 mixed."],
    ["A [MASK] token, [CLS] and [sep] in TEXT; <s> and <mask> too.", "Ångström İstanbul ǅ ß ﬁ ①."],
    ["Zero\u200bwidth, \ufeffbom, emoji 😀 and e\u0301 combining.", "very" + "long" * 40 + "word"],
    [],
    ["Unit\x1fseparator inside a segment.", "Control \x01 character and \x7f delete."],
    ["\u3000", "x"],
    *[[f"Line {i} of a plain ASCII document.", f"Another sentence number {i * 7}."] for i in range(600)],
]


def per_segment_records(tokenizer, documents):
    return [prepared.encode_document(tokenizer.encode_ids(d)) for d in documents]


def assert_same_records(tokenizer, documents=TRICKY_DOCUMENTS):
    batch = DocumentTokenizer(tokenizer).tokenize(documents)
    want = per_segment_records(tokenizer, documents)
    assert batch.records == want
    decoded = [prepared.decode_document(r) for r in want]
    assert batch.segments.tolist() == [len(d) for d in decoded]
    assert batch.tokens.tolist() == [sum(len(s) for s in d) for d in decoded]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram", "sentencepiece_bpe"])
def test_batch_records_equal_per_segment_encoding_for_every_kind(kind):
    assert_same_records(trained(kind))


def test_cased_wordpiece_and_added_words_give_the_same_records():
    cased = tokenizers.Tokenizer.from_str(trained("wordpiece").hf.to_str())
    state = json.loads(cased.to_str())
    state["normalizer"]["lowercase"] = False
    assert_same_records(HfTokenizer("wordpiece", tokenizers.Tokenizer.from_str(json.dumps(state)),
                                    trained("wordpiece").specials))
    extended = tokenizer_extension.extend_tokenizer(trained("wordpiece"), ["ordered", "résumé"])
    assert_same_records(extended)


def test_a_pre_tokenizer_that_marks_only_the_text_start_is_encoded_segment_by_segment():
    hf = tokenizers.Tokenizer(tokenizers.models.Unigram([("<unk>", 0.0), ("▁a", -1.0), ("a", -2.0), ("▁", -3.0)], 0))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Metaspace(prepend_scheme="first")
    specials = SpecialTokens("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")
    tokenizer = HfTokenizer("unigram", hf, specials)
    documents = [["a a", "a"], ["a"]]
    assert tokenizer.encode_ids(["a"])[0].tolist() == [1]  # "▁a": the start is marked ...
    assert_same_records(tokenizer, documents)  # ... for every segment, as when encoded alone.


def test_batch_of_no_documents_is_empty():
    batch = DocumentTokenizer(trained("wordpiece")).tokenize([])
    assert batch.records == [] and batch.segments.size == 0 and np.sum(batch.tokens) == 0
