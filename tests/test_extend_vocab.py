"""extend-vocab: every family's tiny model keeps its old logits bit for bit, new rows start as the mean of their
old pieces, the fragmentation cut is the one the report predicts (counted by transformers), the new-rows warmup
trains the new rows alone, and bad input fails naming the culprit.

The general corpus is the embedded Python documentation (the tokenizers learn from it); the domain corpus is
made here: pharmacology sentences (extend_vocab_models.domain_lines). Skipped cleanly without torch / transformers.
"""
import json
import logging
import pathlib

import numpy as np
import optax
import pytest
from conftest import random_batch
from extend_vocab_models import FAMILIES, domain_lines, general_texts, model_config, train_tokenizer, \
    write_family_folder
from hf_parity import random_params

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import tokenizers  # noqa: E402

from bert_jax.configs import base  # noqa: E402
from bert_jax.hf import folder as hf_folder  # noqa: E402
from bert_jax.vocab import rows as vocab_rows
from bert_jax.families import get_family  # noqa: E402
from bert_jax.train.optimizer import make_optimizer  # noqa: E402
from bert_jax.vocab.extension import REPORT_FILE, ExtendRequest, extend_vocab  # noqa: E402
from data_pipelines.tokenizers import extension as tokenizer_extension  # noqa: E402
from data_pipelines.tokenizers.tokenizer import load_tokenizer  # noqa: E402
from data_pipelines.tokenizers.kinds import HfTokenizer, get_kind  # noqa: E402

ADD = 4
# Held-out general text (the tokenizers learned from the first 200 documents): no pharmacology word in it.
GENERAL = [text[:90] for text in general_texts(212)[200:]]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("extend_vocab")
    (root / "domain.txt").write_text("\n".join(domain_lines()) + "\n")
    return root


@pytest.fixture(scope="module")
def tokenizer_dirs(workspace):
    """One trained tokenizer per kind, saved: {kind: folder}."""
    dirs = {}
    for kind in ("wordpiece", "bpe", "unigram", "sentencepiece_bpe"):
        dirs[kind] = str(workspace / f"tokenizer_{kind}")
        train_tokenizer(kind).save(dirs[kind])
    return dirs


@pytest.fixture(scope="module")
def folders(workspace, tokenizer_dirs):
    """family -> (original HF folder, extended HF folder, report), built once per family on first use."""
    built = {}

    def get(family: str, kind: str | None = None):
        kind = kind or FAMILIES[family][1]
        key = (family, kind)
        if key not in built:
            tokenizer_dir = tokenizer_dirs[kind]
            original, extended = workspace / f"{family}_{kind}", workspace / f"{family}_{kind}_ext"
            write_family_folder(family, tokenizer_dir, load_tokenizer(tokenizer_dir).get_vocab_size(), str(original))
            report = extend_vocab(ExtendRequest(source=str(original), corpus=str(workspace / "domain.txt"),
                                                out=str(extended), add=ADD))
            built[key] = (str(original), str(extended), report)
        return built[key]

    return get


def hf_tokenizer(folder: str):
    return transformers.AutoTokenizer.from_pretrained(folder)


def model_outputs(folder: str, cls: str, texts: list[str]):
    """(input ids, first output: logits or hidden states) of transformers' `cls` loaded from `folder`."""
    tokenizer = hf_tokenizer(folder)
    model = getattr(transformers, cls).from_pretrained(folder).eval()
    inputs = tokenizer(texts, padding=True, truncation=True, max_length=48, return_tensors="pt")
    with torch.no_grad():
        return inputs["input_ids"], model(**inputs)[0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_extension_keeps_every_old_logit_bit_for_bit_and_starts_new_rows_at_their_pieces_mean(folders, family):
    original, extended, report = folders(family)
    assert json.loads((pathlib.Path(extended) / REPORT_FILE).read_text()) == report
    first_new, words = report["first_new_id"], report["words"]
    assert [w["id"] for w in words] == list(range(first_new, first_new + ADD))
    _, _, main_cls, generator_cls = FAMILIES[family]
    for sub, cls in (("", main_cls), ("generator", generator_cls)):
        if cls is None:
            continue
        old_ids, old_out = model_outputs(f"{original}/{sub}", cls, GENERAL)
        new_ids, new_out = model_outputs(f"{extended}/{sub}", cls, GENERAL)
        assert torch.equal(old_ids, new_ids), "text without a new word must tokenize as before"
        if new_out.shape[-1] != old_out.shape[-1]:  # MLM logits: the new (and reused padding) ids come after
            old_out, new_out = old_out[..., :first_new], new_out[..., :first_new]
        assert torch.equal(old_out, new_out), f"{family} {sub or 'main'}: old logits moved"
        # The tensors: old rows untouched, new rows the float64 mean of the old pieces' rows.
        old_state = hf_folder.read_hf_state(f"{original}/{sub}")
        new_state = hf_folder.read_hf_state(f"{extended}/{sub}")
        names = vocab_rows.vocab_tensors(get_family(family))[sub]
        assert all(name in new_state for name in names), "every token-indexed tensor of the folder is extended"
        for name in names:
            np.testing.assert_array_equal(new_state[name][:first_new], old_state[name][:first_new])
            for w in words:
                expected = old_state[name][w["old_ids"]].astype(np.float64).mean(axis=0).astype(np.float32)
                np.testing.assert_array_equal(new_state[name][w["id"]], expected, err_msg=f"{name} {w['word']}")
    # The domain's words now come out whole, in transformers as in the report.
    domain_ids = hf_tokenizer(extended)(" ".join(w["word"] for w in words), add_special_tokens=False)["input_ids"]
    assert domain_ids == [w["id"] for w in words]


@pytest.mark.parametrize("family,kind", [("bert", "wordpiece"), ("roberta", "bpe"), ("albert", "unigram"),
                                         ("albert", "sentencepiece_bpe")])
def test_fragmentation_cut_is_the_reported_one_counted_by_transformers(folders, workspace, family, kind):
    original, extended, report = folders(family, kind)
    lines = (workspace / "domain.txt").read_text().splitlines()
    words = sum(len(line.split()) for line in lines)

    def tokens_per_word(folder):
        tokenizer = hf_tokenizer(folder)
        return sum(len(tokenizer(line, add_special_tokens=False)["input_ids"]) for line in lines) / words

    before, after = tokens_per_word(original), tokens_per_word(extended)
    print(f"{kind}: tokens per word {before:.3f} -> {after:.3f}; the report predicted "
          f"{report['tokens_per_word_predicted']:.3f}")
    assert before == pytest.approx(report["tokens_per_word_before"], abs=1e-12)
    assert after == pytest.approx(report["tokens_per_word_predicted"], abs=1e-12)
    assert after == pytest.approx(report["tokens_per_word_after"], abs=1e-12)
    assert after < 0.7 * before
    saved = [w["tokens_saved"] for w in report["words"]]
    assert saved == sorted(saved, reverse=True) and len(saved) == ADD


def test_our_import_and_export_of_an_extended_folder_give_back_its_tensors(folders):
    """The extended folder continues pre-training through config.init_from_hf: import, then export, is exact."""
    for family in ("bert", "albert", "electra"):
        _, extended, report = folders(family)
        model_cfg = model_config(family, report["vocab_size"])
        fam = get_family(family)
        fallback = random_params(fam.build_model(model_cfg), random_batch(0))
        params = hf_folder.import_params(fam, model_cfg, extended, fallback)
        written = hf_folder.read_hf_state(extended)
        for name, array in fam.hf.to_hf(params, model_cfg).state.items():
            np.testing.assert_array_equal(array, written[name], err_msg=f"{family} {name}")


def test_a_small_corpus_adds_fewer_words_with_a_warning_naming_both_numbers(folders, workspace, caplog):
    original, _, _ = folders("bert")
    (workspace / "tiny.txt").write_text("acetaminophen ibuprofen the the\n")
    with caplog.at_level(logging.WARNING):
        report = extend_vocab(ExtendRequest(source=original, corpus=str(workspace / "tiny.txt"),
                                            out=str(workspace / "tiny_ext"), add=50))
    assert [w["word"] for w in report["words"]] == ["acetaminophen", "ibuprofen"]
    assert "--add=50" in caplog.text and "only 2 candidate" in caplog.text


def test_words_already_in_the_vocabulary_are_never_added_again(folders, workspace):
    _, extended, first = folders("bert")
    report = extend_vocab(ExtendRequest(source=extended, corpus=str(workspace / "domain.txt"),
                                        out=str(workspace / "twice"), add=ADD))
    assert not {w["word"] for w in report["words"]} & {w["word"] for w in first["words"]}
    assert report["first_new_id"] == first["vocab_size"]
    with pytest.raises(ValueError, match="already in the vocabulary"):
        tokenizer_extension.extend_tokenizer(load_tokenizer(extended), [first["words"][0]["word"]])


def test_bad_sources_and_outputs_fail_naming_the_culprit(folders, workspace):
    original, _, _ = folders("bert")
    domain = str(workspace / "domain.txt")
    with pytest.raises(ValueError, match=r"--out=.*already exists; pass --overwrite"):
        extend_vocab(ExtendRequest(source=original, corpus=domain, out=original, add=1))
    unknown = workspace / "gpt2"
    unknown.mkdir()
    (unknown / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="model_type='gpt2' is no registered family"):
        extend_vocab(ExtendRequest(source=str(unknown), corpus=domain, out=str(workspace / "o1"), add=1))
    with pytest.raises(ValueError, match="--init='zeros'"):
        extend_vocab(ExtendRequest(source=original, corpus=domain, out=str(workspace / "o2"), add=1, init="zeros"))
    with pytest.raises(ValueError, match="--add=N"):
        extend_vocab(ExtendRequest(source=original, corpus=domain, out=str(workspace / "o3")))
    # A Unigram tokenizer.json (no SentencePiece model beside it) is a kind extend-vocab cannot grow.
    unigram = HfTokenizer("unigram", tokenizers.Tokenizer(tokenizers.models.Unigram([("<unk>", 0.0)], 0)),
                          get_kind("unigram").specials)
    with pytest.raises(ValueError, match="HfTokenizer of kind 'unigram' cannot be extended"):
        tokenizer_extension.check_extendable(unigram, "--from=X")


def test_new_rows_warmup_changes_only_the_new_rows_then_everything():
    """config.train.new_rows_warmup_steps: the token-indexed params' rows from new_rows_start on, alone, first."""
    train_cfg = ml_collections.ConfigDict({  # configs/base.py's train block, with these values
        **base.get_config().train.to_dict(), **dict(
            optimizer="adamw", learning_rate=0.1, end_learning_rate=0.1, num_steps=10, warmup_steps=0, b1=0.9,
            b2=0.999, eps=1e-6, weight_decay=0.01, max_grad_norm=1.0, new_rows_warmup_steps=2, new_rows_start=3)})
    boxed = {"word": nn.LogicallyPartitioned(jnp.ones((5, 2)), ("vocab", "embed")),
             "bias": nn.LogicallyPartitioned(jnp.ones((5,)), ("vocab",)),
             "dense": nn.LogicallyPartitioned(jnp.ones((5, 2)), ("embed", "mlp"))}
    tx = make_optimizer(train_cfg)
    opt_state = nn.meta.unbox(tx.init(boxed))  # as bert_jax.train.state unboxes the state it builds
    params = nn.meta.unbox(boxed)
    grads = jax.tree.map(jnp.ones_like, params)
    history = []
    for _ in range(3):
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        history.append(jax.tree.map(np.asarray, params))
    for step in (0, 1):
        np.testing.assert_array_equal(history[step]["word"][:3], 1.0)
        np.testing.assert_array_equal(history[step]["bias"][:3], 1.0)
        np.testing.assert_array_equal(history[step]["dense"], 1.0)
        assert np.all(history[step]["word"][3:] < 1.0) and np.all(history[step]["bias"][3:] < 1.0)
    assert np.all(history[2]["word"][:3] < 1.0) and np.all(history[2]["dense"] < 1.0)
    with pytest.raises(ValueError, match="config.train.new_rows_start"):
        make_optimizer(ml_collections.ConfigDict({**train_cfg.to_dict(), "new_rows_start": 0}))
