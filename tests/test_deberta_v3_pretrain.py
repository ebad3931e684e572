"""DeBERTa-v3 end to end (slow): the tiny config pre-trains on the embedded corpus, exports a folder that
transformers loads (model and DebertaV2Tokenizer) with our logits, and a run starts from that folder.
"""
import numpy as np
import pytest

import configs.deberta_v3_base
from bert_jax.export import export, load_workdir_config, restore_params
from bert_jax.families import get_family
from bert_jax.train.loop import train_and_evaluate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from numerics import TRANSFORMERS, relative_error  # noqa: E402
from test_pretrain import train_losses  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 60


def micro_config():
    """configs/deberta_v3_base.py:tiny shrunk to seconds; 64 tokens over 16 buckets still log-bucket."""
    c = configs.deberta_v3_base.get_config("tiny")
    c.model.vocab_size = 1024
    c.model.hidden_size = 32
    c.model.intermediate_size = 64
    c.model.scan_layers = True
    c.data.num_eval_batches = 1
    c.data.tokenizer.sample_bytes = 1_000_000
    c.train.global_batch_size = 8
    c.train.num_steps = STEPS
    c.train.warmup_steps = 4
    c.train.log_every_steps = 4
    c.train.eval_every_steps = c.checkpoint.every_steps = STEPS
    c.logging.plots = False
    c.logging.peak_flops_per_device = 1e11  # skip the matmul measurement
    return c


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    workdir, out = tmp_path_factory.mktemp("deberta_run"), tmp_path_factory.mktemp("deberta_hf")
    train_and_evaluate(micro_config(), str(workdir))
    export(str(workdir), str(out))
    return str(workdir), str(out)


def test_tiny_deberta_v3_pretraining_lowers_the_loss(exported):
    workdir, _ = exported
    losses = [loss for _, loss in train_losses(workdir)]
    print(f"deberta_v3: train loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.3


def test_exported_deberta_v3_loads_in_transformers_with_our_logits(exported):
    workdir, out = exported
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert type(tokenizer).__name__ == "DebertaV2Tokenizer"
    model = transformers.AutoModelForMaskedLM.from_pretrained(out).eval()
    transformers.AutoModel.from_pretrained(out)
    enc = tokenizer([f"the python {tokenizer.mask_token} is a list", "a dict maps keys"], padding=True,
                    return_tensors="np")
    position = int(np.argmax(enc["input_ids"][0] == tokenizer.mask_token_id))
    with torch.no_grad():
        hf_logits = model(input_ids=torch.tensor(enc["input_ids"]),
                          attention_mask=torch.tensor(enc["attention_mask"])).logits.numpy()[:, position]
    config = load_workdir_config(workdir)
    params, _ = restore_params(workdir, config)
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
             "masked_positions": np.array([[position], [position]], np.int32)}
    ours = get_family("deberta_v3").build_model(config.model).apply({"params": params}, batch)
    diff = relative_error(np.asarray(ours["mlm_logits"])[:, 0], hf_logits)
    print(f"deberta_v3 export: relative error of MLM logits {diff:.2e}")
    assert diff <= TRANSFORMERS


def test_init_from_hf_starts_a_deberta_v3_run_from_the_exported_weights(exported, tmp_path):
    import jax

    workdir, out = exported
    c = micro_config()
    c.init_from_hf = out
    c.train.learning_rate, c.train.warmup_steps, c.train.num_steps = 0.0, 0, 1
    c.train.eval_every_steps = c.checkpoint.every_steps = 1
    train_and_evaluate(c, str(tmp_path))
    restarted, _ = restore_params(str(tmp_path), load_workdir_config(str(tmp_path)))
    trained, _ = restore_params(workdir, load_workdir_config(workdir))
    jax.tree.map(np.testing.assert_array_equal, restarted, trained)
