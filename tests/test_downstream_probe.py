"""The downstream probe during pre-training: config.eval.downstream_* checked before the run, and (slow) a run whose
eval steps fine-tune a suite from the current params and log downstream/<task>/<metric> in metrics.jsonl."""
import json
import os
import time

import pytest

from bert_jax.finetune.downstream_probe import DownstreamProbe
from bert_jax.train.config_validation import check_config
from bert_jax.commands.pretrain import downstream_probe
from test_evaluate import micro_suite, write_glue
from test_pretrain import micro_config


def probe_config(glue: str = "", every: int = 4):
    c = micro_config()
    c.eval.downstream_suite, c.eval.downstream_data_dir = "smoke", glue
    c.eval.downstream_tasks, c.eval.downstream_every_steps = "sst2", every
    return c


def test_no_suite_means_no_probe(tmp_path):
    assert downstream_probe(micro_config(), str(tmp_path)) is None


def test_a_cadence_off_the_eval_steps_names_both_keys():
    with pytest.raises(ValueError, match=r"config.eval.downstream_every_steps=6 is not a multiple of "
                                         r"config.train.eval_every_steps=4"):
        check_config(probe_config("/data", every=6))
    with pytest.raises(ValueError, match="needs config.eval.downstream_data_dir"):
        check_config(probe_config(""))


def test_a_missing_task_file_fails_before_the_run_naming_it(tmp_path):
    glue = write_glue(tmp_path / "glue", 8, 4)
    os.remove(f"{glue}/SST-2/dev.tsv")
    with pytest.raises(ValueError, match=f"downstream_suite='smoke': {glue}/SST-2/dev.tsv does not exist"):
        downstream_probe(probe_config(glue), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a micro pre-training and one micro fine-tuning: 90 s on 2 busy cores, over the default budget
def test_the_probe_at_its_default_cadence_adds_its_row_to_metrics_jsonl(tmp_path, xla_compile_cache):
    """Default cadence (every_steps=0): one probe, at the last step, in that step's eval row."""
    from bert_jax.train.loop import train_and_evaluate

    glue = write_glue(tmp_path / "glue", 32, 16)
    c = probe_config(glue, every=0)
    c.train.num_steps = c.train.eval_every_steps = c.checkpoint.every_steps = 2
    c.train.warmup_steps = 1
    c.logging.plots = False
    suite = micro_suite(seeds=1)
    suite.tasks.sst2.finetune.train.epochs = 1.0
    workdir = str(tmp_path / "run")
    train_and_evaluate(c, workdir, downstream=DownstreamProbe(c, workdir, suite))
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    probed = [r for r in rows if any(k.startswith("downstream/") for k in r)]
    assert [r["step"] for r in probed] == [2] and "eval/mlm_accuracy" in probed[0]
    assert 0.0 <= probed[0]["downstream/sst2/accuracy"] <= 1.0 and "downstream/sst2/loss" in probed[0]


@pytest.mark.slow  # a micro pre-training whose two eval steps each fine-tune SST-2-style data
def test_pretraining_logs_downstream_rows_at_its_probe_steps(tmp_path, xla_compile_cache):
    from bert_jax.train.loop import train_and_evaluate

    glue = write_glue(tmp_path / "glue", 128, 32)
    c = probe_config(glue, every=4)
    c.train.num_steps = 8
    suite = micro_suite(seeds=1)
    t0 = time.time()
    train_and_evaluate(c, str(tmp_path / "plain"))
    plain = time.time() - t0
    t0 = time.time()
    workdir = str(tmp_path / "probed")
    train_and_evaluate(c, workdir, downstream=DownstreamProbe(c, workdir, suite))
    probed = time.time() - t0
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    probe_rows = [r for r in rows if "downstream/sst2/accuracy" in r]
    assert [r["step"] for r in probe_rows] == [4, 8]
    assert all("eval/mlm_accuracy" in r for r in probe_rows)  # beside MLM accuracy, in the eval row
    assert os.path.exists(os.path.join(workdir, "downstream", "step_8", "sst2", "DONE"))
    # A finished probe keeps its results, not its weights: the workdir does not grow by a checkpoint per probe.
    assert not os.path.exists(os.path.join(workdir, "downstream", "step_4", "sst2", "checkpoints"))
    plain_rows = [json.loads(line) for line in open(tmp_path / "plain" / "metrics.jsonl")]
    losses = lambda rs: [(r["step"], r["train/loss"]) for r in rs if "train/loss" in r]  # noqa: E731
    assert losses(rows) == losses(plain_rows)  # the probe leaves the pre-training itself untouched
    print(f"micro run: {plain:.1f} s plain, {probed:.1f} s with 2 probes; "
          f"sst2 accuracy {[r['downstream/sst2/accuracy'] for r in probe_rows]}")
