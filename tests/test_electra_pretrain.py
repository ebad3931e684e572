"""ELECTRA end to end through the one loop: a tiny run learns (the discriminator beats the all-original rate,
the generator the most-frequent-token floor), resumes exactly with its sampling, exports a discriminator and a
generator folder that transformers loads with our logits, and a run can start from that export.
"""
import jax
import numpy as np
import pytest

import bert_jax.configs.electra_small
from bert_jax.checkpoint.params import restore_params
from bert_jax.families import model_for
from bert_jax.train.export import export
from bert_jax.storage.workdir import Workdir
from bert_jax.families import get_family
from bert_jax.models.electra import Electra
from bert_jax.train.loop import train_and_evaluate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from numerics import TRANSFORMERS, relative_error  # noqa: E402
from test_pretrain import read_metrics, train_losses  # noqa: E402

STEPS = 40
# How far above its trivial baseline each tiny metric must end: the runs repeat bit for bit, so this is
# headroom against a change of recipe, not against noise.
MARGIN = 0.01


def micro_config(num_steps: int = STEPS):
    """configs/electra_small.py:tiny shrunk to seconds a step: the same code paths, a smaller model and batch."""
    c = bert_jax.configs.electra_small.get_config("tiny")
    c.model.vocab_size = 1024
    c.model.hidden_size = 32
    c.model.embedding_size = 16
    c.model.intermediate_size = 64
    c.model.max_position_embeddings = 64
    c.model.scan_layers = True
    c.model.dropout_rate = 0.1  # dropout and sampling must both resume exactly
    c.data.max_seq_length = 64
    c.data.mask_rate = 10 / 64  # the rate its former cap of 10 trained at; max_predictions_per_seq: auto, 10
    c.data.num_eval_batches = 2
    c.data.tokenizer.sample_bytes = 1_000_000
    c.train.global_batch_size = 8
    c.train.num_steps = num_steps
    c.train.warmup_steps = 4
    c.train.log_every_steps = 4
    c.train.eval_every_steps = c.checkpoint.every_steps = num_steps // 2
    c.logging.plots = False
    c.logging.peak_flops_per_device = 1e11  # skip the matmul measurement
    return c


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    workdir, out = tmp_path_factory.mktemp("electra_run"), tmp_path_factory.mktemp("electra_hf")
    final = train_and_evaluate(micro_config(), str(workdir))
    export(str(workdir), str(out))
    return str(workdir), str(out), final


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """configs/electra_small.py:tiny as docs/guides/families.md's command runs it (the same numbers, bit for bit)."""
    c = bert_jax.configs.electra_small.get_config("tiny")
    c.logging.plots = False
    c.logging.peak_flops_per_device = 1e11
    workdir = str(tmp_path_factory.mktemp("electra_tiny"))
    final = train_and_evaluate(c, workdir)
    print(f"eval: discriminator accuracy {final['eval/discriminator_accuracy']:.4f} vs all-original "
          f"{1.0 - final['eval/replaced_rate']:.4f} (replaced {final['eval/discriminator_replaced_accuracy']:.4f}, "
          f"original {final['eval/discriminator_original_accuracy']:.4f}); generator MLM accuracy "
          f"{final['eval/generator_mlm_accuracy']:.4f} vs most-frequent-token "
          f"{final['eval/most_frequent_token_accuracy']:.4f}")
    return workdir, final


@pytest.mark.slow  # 1500 steps: 4-5 min of a busy 2-core machine
def test_tiny_electra_discriminator_beats_the_all_original_rate(tiny_run):
    workdir, final = tiny_run
    assert final["eval/discriminator_accuracy"] > 1.0 - final["eval/replaced_rate"] + MARGIN
    assert final["eval/discriminator_replaced_accuracy"] > MARGIN
    train_rows = [r for r in read_metrics(workdir) if "train/loss" in r]
    assert all("train/discriminator_accuracy" in r and "train/generator_mlm_accuracy" in r for r in train_rows)


@pytest.mark.slow
def test_tiny_electra_generator_beats_the_most_frequent_token(tiny_run):
    _, final = tiny_run
    assert final["eval/generator_mlm_accuracy"] > final["eval/most_frequent_token_accuracy"] + MARGIN


@pytest.mark.slow
def test_electra_resume_gives_identical_losses_and_eval_metrics(exported, tmp_path):
    workdir, _, final = exported
    resumed = str(tmp_path / "resumed")
    train_and_evaluate(micro_config(), resumed, stop_at_step=STEPS // 2)
    again = train_and_evaluate(micro_config(), resumed)
    assert train_losses(resumed) == train_losses(workdir)  # bit for bit, the generator's samples included
    eval_rows = lambda w: [r for r in read_metrics(w) if "eval/loss" in r]  # noqa: E731
    assert eval_rows(resumed)[-1] == eval_rows(workdir)[-1] and again["eval/loss"] == final["eval/loss"]


@pytest.mark.slow
def test_exported_electra_loads_in_transformers_with_our_logits(exported):
    workdir, out, _ = exported
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert transformers.AutoTokenizer.from_pretrained(f"{out}/generator").get_vocab() == tokenizer.get_vocab()
    discriminator = transformers.ElectraForPreTraining.from_pretrained(out).eval()
    generator = transformers.AutoModelForMaskedLM.from_pretrained(f"{out}/generator").eval()
    assert isinstance(generator, transformers.ElectraForMaskedLM)
    transformers.AutoModel.from_pretrained(out)  # the bare encoder loads too
    enc = tokenizer([f"the python {tokenizer.mask_token} is a list", "a dict maps keys"], padding=True,
                    return_tensors="np")
    position = int(np.argmax(enc["input_ids"][0] == tokenizer.mask_token_id))
    inputs = {k: torch.tensor(v) for k, v in enc.items()}
    with torch.no_grad():
        hf_disc = discriminator(**inputs).logits.numpy()
        hf_gen = generator(**inputs).logits.numpy()[:, position]

    config = Workdir(workdir).config()
    params, _ = restore_params(Workdir(workdir), model_for)
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
             "token_type_ids": enc["token_type_ids"], "masked_positions": np.array([[position], [position]], np.int32)}
    model = get_family("electra").build_model(config.model)
    ours_disc = np.asarray(model.apply({"params": params}, batch, method=Electra.discriminator_logits))
    ours_gen = np.asarray(model.apply({"params": params}, batch, method=Electra.generator_logits))[:, 0]
    real = enc["attention_mask"] > 0
    disc_diff, gen_diff = relative_error(ours_disc[real], hf_disc[real]), relative_error(ours_gen, hf_gen)
    print(f"electra export: relative error discriminator {disc_diff:.2e}, generator {gen_diff:.2e}")
    assert disc_diff <= TRANSFORMERS and gen_diff <= TRANSFORMERS


@pytest.mark.slow
def test_init_from_hf_restarts_electra_from_both_exported_folders(exported, tmp_path):
    workdir, out, _ = exported
    c = micro_config(num_steps=1)
    c.init_from_hf = out
    c.train.learning_rate, c.train.warmup_steps = 0.0, 0
    c.train.eval_every_steps = c.checkpoint.every_steps = 1
    train_and_evaluate(c, str(tmp_path))
    restarted, _ = restore_params(Workdir(str(tmp_path)), model_for)
    trained, _ = restore_params(Workdir(workdir), model_for)
    jax.tree.map(np.testing.assert_array_equal, restarted, trained)  # the generator too: it came from generator/
