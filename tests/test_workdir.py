"""The workdir as a value: the contracted names, its config read back, clear errors for what it lacks.

Restoring params from real runs is pinned where the runs are made: tests/test_pretrain.py
(local) and tests/test_cloud_pretrain.py (gs://).
"""
import json

import pytest

import bert_jax.configs.tiny
from bert_jax.checkpoint.params import restore_params
from bert_jax.families import model_for
from bert_jax.storage.workdir import Workdir


def write_config_as_a_run_does(root, config) -> None:
    """What train/loop.py writes: ml_collections' JSON plus the run identity."""
    resolved = json.loads(config.to_json_best_effort())
    resolved["run_identity"] = {"tokenizer_sha256": "0" * 64}
    (root / "config.json").write_text(json.dumps(resolved, indent=2, sort_keys=True))


def test_sub_paths_carry_the_contracted_names_locally_and_in_a_bucket(tmp_path):
    # docs/design.md's workdir table: other tools (launchers, sweeps, users' scripts) open these names.
    for root in (str(tmp_path), "gs://bucket/runs/a", "s3://bucket/runs/a"):
        run = Workdir(root)
        names = {run.config_json: "config.json", run.checkpoints: "checkpoints", run.metrics_jsonl: "metrics.jsonl",
                 run.tokenizer: "tokenizer", run.plots: "plots", run.done: "DONE", run.labels_json: "labels.json",
                 run.best_params: "best/params", run.best_json: "best.json", run.results_json: "results.json",
                 run.predictions_jsonl: "predictions.jsonl", run.diagnosis_json: "diagnosis.json",
                 run.seeds_json: "seeds.json", run.seed(3).config_json: "seed_3/config.json"}
        for path, name in names.items():
            assert str(path) == f"{root}/{name}"  # a URL stays a URL, never $PWD/gs:/...
    assert Workdir("gs://bucket/runs/a") == Workdir(Workdir("gs://bucket/runs/a").root)


def test_config_reads_back_what_a_run_wrote_with_its_tuples(tmp_path):
    config = bert_jax.configs.tiny.get_config()
    write_config_as_a_run_does(tmp_path, config)
    read = Workdir(tmp_path).config()
    for key in config:
        assert read[key] == config[key], key  # mesh shape and axis rules come back as tuples, not lists
    assert read.run_identity.tokenizer_sha256 == "0" * 64


def test_a_folder_without_config_json_fails_naming_it(tmp_path):
    with pytest.raises(ValueError, match=rf"{tmp_path / 'config.json'} does not exist"):
        Workdir(tmp_path).config()
    with pytest.raises(ValueError, match=rf"{tmp_path / 'config.json'} does not exist"):
        restore_params(Workdir(tmp_path), model_for)


def test_a_workdir_without_a_checkpoint_fails_naming_its_checkpoints_folder(tmp_path):
    write_config_as_a_run_does(tmp_path, bert_jax.configs.tiny.get_config())
    run = Workdir(tmp_path)
    assert not run.holds_a_run() and run.checkpoint_steps() == []
    with pytest.raises(ValueError, match=rf"{run.checkpoints} holds no checkpoint"):
        restore_params(run, model_for)
    (tmp_path / "checkpoints" / "4.orbax-checkpoint-tmp-0").mkdir(parents=True)  # a save killed before its commit
    assert run.holds_a_run() and run.checkpoint_steps() == []
    with pytest.raises(ValueError, match=rf"{run.checkpoints} holds no checkpoint"):
        restore_params(run, model_for)
