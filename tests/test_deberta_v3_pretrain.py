"""DeBERTa-v3 end to end (slow): the tiny config pre-trains by replaced-token detection on the embedded corpus
(the discriminator beats calling every token original, the generator beats the most frequent token); a micro
run exports the discriminator as a DebertaV2Model folder that transformers loads (model and
DebertaV2Tokenizer) with our hidden states, and the generator beside it; a run starts from that folder.
"""
import jax
import numpy as np
import pytest

import bert_jax.configs.deberta_v3_base
from bert_jax.checkpoint.params import restore_params
from bert_jax.families import model_for
from bert_jax.train.export import export
from bert_jax.storage.workdir import Workdir
from bert_jax.families import get_family
from bert_jax.train.loop import train_and_evaluate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from numerics import TRANSFORMERS, relative_error  # noqa: E402
from test_pretrain import read_metrics, train_losses  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 40
MARGIN = 0.01  # how far above its trivial baseline each tiny metric must end (see test_electra_pretrain.py)


def tiny_config():
    """configs/deberta_v3_base.py:tiny as docs/guides/families.md runs it (the same numbers), without plots."""
    c = bert_jax.configs.deberta_v3_base.get_config("tiny")
    c.logging.plots = False
    c.logging.peak_flops_per_device = 1e11  # skip the matmul measurement
    return c


def micro_config():
    """The tiny config shrunk to seconds a step: the same code paths; 64 tokens over 16 buckets."""
    c = tiny_config()
    c.model.vocab_size = 1024
    c.model.hidden_size = 32
    c.model.intermediate_size = 64
    c.model.scan_layers = True
    c.model.dropout_rate = c.model.attention_dropout_rate = 0.1  # dropout and sampling must both resume exactly
    c.data.max_seq_length = 64
    c.data.mask_rate = 10 / 64  # the rate its former cap of 10 trained at; max_predictions_per_seq: auto, 10
    c.data.num_eval_batches = 2
    c.data.tokenizer.sample_bytes = 1_000_000
    c.train.global_batch_size = 8
    c.train.num_steps = STEPS
    c.train.warmup_steps = 4
    c.train.log_every_steps = 4
    c.train.eval_every_steps = c.checkpoint.every_steps = STEPS // 2
    return c


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    workdir, out = tmp_path_factory.mktemp("deberta_run"), tmp_path_factory.mktemp("deberta_hf")
    final = train_and_evaluate(micro_config(), str(workdir))
    export(str(workdir), str(out))
    return str(workdir), str(out), final


def test_micro_deberta_v3_run_lowers_the_loss(exported):
    workdir, _, _ = exported
    losses = [loss for _, loss in train_losses(workdir)]
    print(f"deberta_v3 micro run: train loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


def test_deberta_v3_resume_gives_identical_losses_and_eval_metrics(exported, tmp_path):
    workdir, _, final = exported
    resumed = str(tmp_path / "resumed")
    train_and_evaluate(micro_config(), resumed, stop_at_step=STEPS // 2)
    again = train_and_evaluate(micro_config(), resumed)
    assert train_losses(resumed) == train_losses(workdir)  # bit for bit: dropout and the generator's samples
    eval_rows = lambda w: [r for r in read_metrics(w) if "eval/loss" in r]  # noqa: E731
    assert eval_rows(resumed)[-1] == eval_rows(workdir)[-1] and again["eval/loss"] == final["eval/loss"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The documented tiny run (4-5 min on a busy 2-core machine): its last eval row and train losses."""
    workdir = str(tmp_path_factory.mktemp("deberta_tiny"))
    train_and_evaluate(tiny_config(), workdir)
    final = [r for r in read_metrics(workdir) if "eval/loss" in r][-1]
    print(f"deberta_v3 tiny: eval discriminator accuracy {final['eval/discriminator_accuracy']:.4f} vs "
          f"all-original {1.0 - final['eval/replaced_rate']:.4f} (replaced "
          f"{final['eval/discriminator_replaced_accuracy']:.4f}, original "
          f"{final['eval/discriminator_original_accuracy']:.4f}); generator MLM accuracy "
          f"{final['eval/generator_mlm_accuracy']:.4f} vs most frequent token "
          f"{final['eval/most_frequent_token_accuracy']:.4f}")
    return [loss for _, loss in train_losses(workdir)], final


def test_tiny_deberta_v3_generator_beats_the_most_frequent_token(tiny_run):
    losses, final = tiny_run
    assert np.isfinite(losses).all() and losses[-1] < losses[0] - 1.0
    assert final["eval/generator_mlm_accuracy"] > final["eval/most_frequent_token_accuracy"] + MARGIN


def test_tiny_deberta_v3_discriminator_beats_the_all_original_rate(tiny_run):
    _, final = tiny_run
    assert final["eval/discriminator_accuracy"] > 1.0 - final["eval/replaced_rate"] + MARGIN
    assert final["eval/discriminator_replaced_accuracy"] > MARGIN


def test_exported_deberta_v3_loads_in_transformers_with_our_discriminator_states(exported):
    workdir, out, _ = exported
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    assert type(tokenizer).__name__ == "DebertaV2Tokenizer"
    model = transformers.AutoModel.from_pretrained(out).eval()
    assert type(model).__name__ == "DebertaV2Model"
    generator = transformers.AutoModelForMaskedLM.from_pretrained(f"{out}/generator")
    assert type(generator).__name__ == "DebertaV2ForMaskedLM" and generator.config.num_hidden_layers == 1
    enc = tokenizer(["the python list is a sequence", "a dict maps keys"], padding=True, return_tensors="np")
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(enc["input_ids"]),
                       attention_mask=torch.tensor(enc["attention_mask"])).last_hidden_state.numpy()
    config = Workdir(workdir).config()
    params, _ = restore_params(Workdir(workdir), model_for)
    ours = np.asarray(get_family("deberta_v3").build_model(config.model).apply(
        {"params": params}, enc, method=lambda m, b: m.discriminator.encoder(b["input_ids"], b["attention_mask"])))
    real = enc["attention_mask"].astype(bool)
    diff = relative_error(ours[real], theirs[real])
    print(f"deberta_v3 export: relative error of the discriminator's hidden states {diff:.2e}")
    assert diff <= TRANSFORMERS


def test_init_from_hf_continues_from_the_exported_discriminator(exported, tmp_path):
    workdir, out, _ = exported
    c = micro_config()
    c.init_from_hf = out
    c.train.learning_rate, c.train.warmup_steps, c.train.num_steps = 0.0, 0, 1
    c.train.eval_every_steps = c.checkpoint.every_steps = 1
    train_and_evaluate(c, str(tmp_path))
    restarted, _ = restore_params(Workdir(str(tmp_path)), model_for)
    trained, _ = restore_params(Workdir(workdir), model_for)
    # The generator folder came along: every network is back, the delta up to one float32 rounding.
    for part in ("discriminator", "generator", "word"):
        jax.tree.map(np.testing.assert_array_equal, restarted[part], trained[part])
    np.testing.assert_allclose(restarted["discriminator_word"]["delta"], trained["discriminator_word"]["delta"],
                               rtol=0, atol=1e-6 * np.abs(trained["word"]["embedding"]).max())
