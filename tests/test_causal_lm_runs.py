"""Issue 78's acceptance in miniature: a causal run of modernbert_base.py:tiny,clm exports a
ModernBertDecoderForCausalLM whose loss on the run's held-out text is the run's own eval CLM loss, and a biphasic run
(tiny,biphasic) trains CLM then MLM in one run, resumes exactly inside either phase and exports a masked LM."""
import os
import shutil
import sys

import numpy as np
import pytest

import bert_jax
import bert_jax.configs.modernbert_base as modernbert_base
from bert_jax.commands.inspect import inspect
from bert_jax.finetune import init_from
from bert_jax.run.completion import read_done
from bert_jax.storage.workdir import Workdir
from bert_jax.train.export import export
from data_pipelines.loader import pipeline
from data_pipelines.tokenizers.tokenizer import load_tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_pretrain import read_metrics, train_losses  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def micro(variant: str):
    """configs/modernbert_base.py:tiny,<variant> cut to 8 steps of 8 rows: the same code paths in seconds."""
    c = modernbert_base.get_config(f"tiny,{variant}")
    c.data.max_seq_length = 64
    c.model.max_position_embeddings = 64
    c.data.num_eval_batches = 2
    c.train.global_batch_size = 8
    c.train.num_steps = 8
    c.train.warmup_steps = 2
    c.train.log_every_steps = 1
    c.train.eval_every_steps = 4
    c.checkpoint.every_steps = 2
    c.checkpoint.max_to_keep = 8
    c.logging.peak_flops_per_device = 1e11  # skip the matmul measurement
    if variant == "biphasic":
        c.train.objective_switch.fraction = 0.5  # CLM for steps 1-4, MLM for 5-8
    return c


def hf_loss_on_held_out_text(workdir: str, folder: str) -> float:
    """transformers' mean next-token loss over the run's eval batches, each packed document run on its own."""
    run = Workdir(workdir)
    config = run.config()
    sets = pipeline.build_eval_sets(config.data, load_tokenizer(str(run.tokenizer)), seed=config.seed,
                                    per_host_batch_size=config.train.global_batch_size)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(model).__name__ == "ModernBertDecoderForCausalLM"
    total, count = 0.0, 0
    for _, batches in sets:
        for batch in batches:
            for ids, segments, real in zip(batch["input_ids"], batch["segment_ids"], batch["attention_mask"] > 0):
                for segment in np.unique(segments[real]):
                    document = torch.tensor(ids[real & (segments == segment)][None], dtype=torch.long)
                    if document.shape[1] < 2:
                        continue
                    with torch.no_grad():
                        loss = model(document, labels=document).loss.item()
                    total, count = total + loss * (document.shape[1] - 1), count + document.shape[1] - 1
    return total / count


@pytest.mark.slow  # a micro run, an export and transformers over the eval documents: ~1 minute on 2 cores
def test_a_causal_run_exports_a_decoder_whose_loss_is_the_runs_eval_loss(tmp_path, xla_compile_cache):
    from bert_jax.train.loop import train_and_evaluate  # noqa: PLC0415

    workdir, out = str(tmp_path / "run"), str(tmp_path / "hf")
    train_and_evaluate(micro("clm"), workdir)
    rows = read_metrics(workdir)
    assert all("train/clm_loss" in r and "train/mlm_loss" not in r for r in rows if "train/loss" in r)
    final = [r for r in rows if "eval/clm_loss" in r][-1]
    assert final["step"] == 8 and final["eval/perplexity"] == pytest.approx(np.exp(final["eval/clm_loss"]), rel=1e-5)
    export(workdir, out)
    with open(os.path.join(out, "README.md")) as card:
        text = card.read()
    assert "pipeline_tag: text-generation" in text and "by stage: `clm` steps 1-8." in text
    theirs = hf_loss_on_held_out_text(workdir, out)
    print(f"eval/clm_loss {final['eval/clm_loss']:.6f}, transformers on the same documents {theirs:.6f}")
    assert theirs == pytest.approx(final["eval/clm_loss"], rel=0.01)

    # inspect --mode=generate: the run and its export continue a prompt alike; sampling repeats with its seed.
    greedy = list(inspect(workdir, "generate", text="The history of", max_new_tokens=8))
    assert greedy[0].startswith("generated ") and greedy[1].startswith("The history of")
    assert list(inspect(out, "generate", text="The history of", max_new_tokens=8)) == greedy
    sampled = [list(inspect(workdir, "generate", text="The history of", max_new_tokens=8, temperature=1.0, seed=s))
               for s in (1, 1)]
    assert sampled[0] == sampled[1] and "temperature 1.0" in sampled[0][0]


@pytest.mark.slow  # four micro runs (straight, then killed in each phase and resumed) and two exports: ~3 minutes
def test_a_biphasic_run_trains_clm_then_mlm_resumes_in_either_phase_and_exports_a_masked_lm(tmp_path,
                                                                                          xla_compile_cache):
    from bert_jax.train.loop import train_and_evaluate  # noqa: PLC0415

    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    train_and_evaluate(micro("biphasic"), straight)
    rows = [r for r in read_metrics(straight) if "train/loss" in r]
    assert [r["step"] for r in rows if "train/clm_loss" in r] == [1, 2, 3, 4]
    assert [r["step"] for r in rows if "train/mlm_loss" in r] == [5, 6, 7, 8]
    shutil.copytree(os.path.join(straight, "tokenizer"), os.path.join(killed, "tokenizer"))
    train_and_evaluate(micro("biphasic"), killed, stop_at_step=2)  # inside the causal phase
    train_and_evaluate(micro("biphasic"), killed, stop_at_step=6)  # across the switch, into the masked phase
    train_and_evaluate(micro("biphasic"), killed)
    assert train_losses(killed) == train_losses(straight)
    assert read_done(killed)["step"] == 8

    export(straight, str(tmp_path / "final"))
    with open(os.path.join(tmp_path, "final", "README.md")) as card:
        assert "by stage: `clm` steps 1-4, `mlm` steps 5-8." in card.read()
    masked = transformers.AutoModelForMaskedLM.from_pretrained(str(tmp_path / "final"))
    assert type(masked).__name__ == "ModernBertForMaskedLM"
    export(straight, str(tmp_path / "causal_phase"), step=4)  # a checkpoint of the causal phase is a decoder
    decoder = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "causal_phase"))
    assert type(decoder).__name__ == "ModernBertDecoderForCausalLM"
    # Fine-tuning reads the encoder as the stage that trained the step: bidirectional after the switch.
    assert init_from.resolve(straight, {}).model_cfg.objective == "mlm"
    assert init_from.resolve(f"{straight}:4", {}).model_cfg.objective == "clm"
    with pytest.raises(bert_jax.UserError, match="--mode=generate needs a causally trained checkpoint"):
        list(inspect(straight, "generate", text="The history of", max_new_tokens=2))
    assert len(list(inspect(f"{straight}:4", "generate", text="The history of", max_new_tokens=2))) == 2
