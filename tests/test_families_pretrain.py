"""RoBERTa, ALBERT and ModernBERT end to end: the tiny configs pre-train (the loss falls), export to a Hugging Face folder
that transformers loads (AutoModelForMaskedLM, AutoModel, AutoTokenizer) with our logits, and a run can
start from that folder (`config.init_from_hf`).
"""
import os

import jax
import numpy as np
import pytest

import bert_jax.configs.albert_base
import bert_jax.configs.modernbert_base
import bert_jax.configs.roberta_base
from bert_jax.checkpoint.params import restore_params
from bert_jax.families import model_for
from bert_jax.train.export import export
from bert_jax.storage.workdir import Workdir
from bert_jax.families import get_family
from bert_jax.train.loop import train_and_evaluate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from numerics import TRANSFORMERS, relative_error  # noqa: E402
from test_pretrain import train_losses  # noqa: E402

CONFIGS = {"roberta": bert_jax.configs.roberta_base, "albert": bert_jax.configs.albert_base,
           "modernbert": bert_jax.configs.modernbert_base}
STEPS = 40
# Families whose run goes with -m slow only, to keep the default suite within its time budget
# (ModernBERT's: ~70 s on a loaded 2-core CPU, training, export and the transformers reload; RoBERTa's ~20 s, whose
# conversion tests/test_hf_roberta.py checks by default; ModernBERT's export also runs in tests/test_recipes.py;
# ALBERT's ~39 s, whose conversion and SOP logits tests/test_hf_albert.py checks by default).
SLOW_FAMILIES = ("albert", "modernbert", "roberta")
FAMILIES = [pytest.param(f, marks=pytest.mark.slow) if f in SLOW_FAMILIES else f for f in sorted(CONFIGS)]


def micro_config(family: str):
    """The family's `:tiny` config shrunk to seconds: the same code paths, a smaller model and batch."""
    c = CONFIGS[family].get_config("tiny")
    c.model.vocab_size = 1024
    c.model.hidden_size = 32
    c.model.intermediate_size = 64
    c.model.scan_layers = True
    # The rate a cap of 10 trained these runs at before max_predictions_per_seq became auto (auto: 10 again).
    c.data.mask_rate = 10 / c.data.max_seq_length
    c.data.num_eval_batches = 1
    c.data.tokenizer.sample_bytes = 1_000_000  # plenty for 1024 tokens; SentencePiece trains in seconds
    c.train.global_batch_size = 8
    c.train.num_steps = STEPS
    c.train.warmup_steps = 4
    c.train.log_every_steps = 4
    c.train.eval_every_steps = c.checkpoint.every_steps = STEPS
    c.logging.plots = False
    c.logging.peak_flops_per_device = 1e11  # skip the matmul measurement
    return c


@pytest.fixture(scope="module", params=FAMILIES)
def exported(request, tmp_path_factory):
    """A micro pre-training run of the family, exported to a Hugging Face folder."""
    family = request.param
    workdir, out = tmp_path_factory.mktemp(f"{family}_run"), tmp_path_factory.mktemp(f"{family}_hf")
    train_and_evaluate(micro_config(family), str(workdir))
    export(str(workdir), str(out))
    return family, str(workdir), str(out)


def test_tiny_family_pretraining_lowers_the_loss(exported):
    family, workdir, _ = exported
    losses = [loss for _, loss in train_losses(workdir)]
    print(f"{family}: train loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.3


def test_exported_family_run_fills_mask_in_transformers_with_our_logits(exported):
    family, workdir, out = exported
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    transformers.AutoModel.from_pretrained(out)  # the bare encoder loads too
    enc = tokenizer([f"the python {tokenizer.mask_token} is a list", "a dict maps keys"], padding=True,
                    return_tensors="np")
    assert tokenizer.mask_token_id in enc["input_ids"][0]
    position = int(np.argmax(enc["input_ids"][0] == tokenizer.mask_token_id))
    with torch.no_grad():
        hf_logits = model(**{k: torch.tensor(v) for k, v in enc.items()}).logits.numpy()[:, position]

    config = Workdir(workdir).config()
    params, _ = restore_params(Workdir(workdir), model_for)
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
             "token_type_ids": enc.get("token_type_ids", np.zeros_like(enc["input_ids"])),
             "masked_positions": np.array([[position], [position]], np.int32)}
    ours = get_family(family).build_model(config.model).apply({"params": params}, batch)
    diff = relative_error(np.asarray(ours["mlm_logits"])[:, 0], hf_logits)
    filled = tokenizer.decode([int(np.argmax(hf_logits[0]))])
    print(f"{family} export: {tokenizer.mask_token} -> {filled!r}; relative error of MLM logits {diff:.2e}")
    assert diff <= TRANSFORMERS


@pytest.mark.slow
def test_init_from_hf_starts_a_family_run_from_the_exported_weights(exported, tmp_path):
    family, workdir, out = exported
    c = micro_config(family)
    c.init_from_hf = out
    c.train.learning_rate, c.train.warmup_steps, c.train.num_steps = 0.0, 0, 1
    c.train.eval_every_steps = c.checkpoint.every_steps = 1
    train_and_evaluate(c, str(tmp_path))
    restarted, _ = restore_params(Workdir(str(tmp_path)), model_for)
    trained, _ = restore_params(Workdir(workdir), model_for)
    # The tokenizer itself travels (tokenizer_config.json differs: export sets model_max_length;
    # sample.json records how the first run trained it, which an HF folder does not carry).
    for name in set(os.listdir(os.path.join(workdir, "tokenizer"))) - {"tokenizer_config.json", "sample.json"}:
        with open(os.path.join(workdir, "tokenizer", name), "rb") as a, open(tmp_path / "tokenizer" / name, "rb") as b:
            assert a.read() == b.read(), name
    jax.tree.map(np.testing.assert_array_equal, restarted, trained)


def test_a_pad_id_the_tokenizer_does_not_use_fails_before_training(tmp_path):
    """RoBERTa's positions hang on the pad id: a WordPiece tokenizer pads with 0, the config says 1."""
    c = micro_config("roberta")
    c.data.tokenizer.kind = "wordpiece"
    with pytest.raises(ValueError, match=r"config\.model\.pad_token_id=1 .* pads with id 0"):
        train_and_evaluate(c, str(tmp_path))
    assert not os.path.exists(tmp_path / "checkpoints")
