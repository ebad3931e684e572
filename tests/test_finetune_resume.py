"""A killed fine-tuning run of every kind resumes exactly: rerunning the same command after `stop_at_step` gives the
uninterrupted run's losses, validations, results and test predictions (classification and tagging:
tests/test_finetune.py)."""
import json
import os

import pytest

import finetune_data as fd
from bert_jax.finetune.run import finetune
from test_finetune import STS_FIELDS, micro_config

pytest.importorskip("torch")  # the tiny Hugging Face folder is written by transformers


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("resume_inputs")
    return {"hf_dir": fd.write_tiny_hf_bert(str(d / "hf")),
            "pairs_train.csv": fd.write_csv(d / "pairs_train.csv", fd.sts_rows(96, 0), STS_FIELDS),
            "pairs_test.csv": fd.write_csv(d / "pairs_test.csv", fd.sts_rows(32, 1), STS_FIELDS),
            "train.json": fd.write_squad(d / "train.json", 48, 0),
            "test.json": fd.write_squad(d / "test.json", 16, 1),
            "pairs_pos.csv": fd.write_csv(d / "pairs_pos.csv", fd.paraphrase_rows(96, 2), STS_FIELDS),
            "sts_test.csv": fd.write_csv(d / "sts_test.csv", fd.sts_rows(32, 1), STS_FIELDS)}


def logged(workdir: str) -> list[dict]:
    """metrics.jsonl without its wall-clock keys: every loss and validation, by step."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    return [{k: v for k, v in row.items() if k.startswith(("train/loss", "eval/")) or k == "step"} for row in rows]


@pytest.mark.slow  # ~25 s per kind: three runs of 11 to 15 steps, compiled once (the XLA cache)
@pytest.mark.parametrize("kind", ["regression", "span_qa", "sentence_embedding"])
def test_a_killed_finetuning_run_of_every_kind_resumes_with_identical_results(kind, inputs, tmp_path,
                                                                              xla_compile_cache):
    c = micro_config(kind, inputs["hf_dir"], inputs)
    c.model.dropout_rate = 0.1  # dropout keys must resume too
    c.train.epochs, c.train.batch_size = 2.0, 16  # the kill falls in the first epoch, the resume crosses into the next
    c.train.log_every_steps = 1
    c.train.eval_every_steps = 2  # a validation just before the kill, and after it
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    a = finetune(c, straight)
    assert a["num_steps"] > 8
    assert finetune(c, resumed, stop_at_step=5) == {"stopped_at": 5}
    assert not os.path.exists(os.path.join(resumed, "results.json"))
    b = finetune(c, resumed)
    assert logged(resumed) == logged(straight)
    assert a == b  # validation and test metrics, diagnosis
    assert open(os.path.join(resumed, "predictions.jsonl")).read() == open(
        os.path.join(straight, "predictions.jsonl")).read()
