"""A resume refuses a changed experiment, naming the keys; accepted changes are recorded, never lost."""
import json
import os
import sys

import pytest

from bert_jax.storage.workdir import Workdir
from bert_jax.run import experiment
from bert_jax.train.loop import train_and_evaluate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_pretrain import micro_config, read_metrics  # noqa: E402
from conftest import with_changes

RECORDED = {"seed": 0, "data": {"masking": "whole_word", "path": "a", "max_predictions_per_seq": 20},
            "train": {"num_steps": 10, "log_every_steps": 5, "stages": []}, "logging": {"wandb_mode": "disabled"},
            "run_identity": {"git_commit": "x"}}


def _with(**changes):
    return with_changes(json.loads(json.dumps(RECORDED)), **changes)


def test_a_changed_experiment_key_is_refused_naming_it_and_the_flag():
    with pytest.raises(experiment.ExperimentChangedError) as refused:
        experiment.check_resume(RECORDED, _with(data__masking="token"), "", "DIR", 40)
    first, *keys = str(refused.value).splitlines()
    assert "--config.accept_changes=data.masking" in first and "step 40" in first
    assert keys == ['config.data.masking: "whole_word" -> "token"']  # one line per key
    with pytest.raises(experiment.ExperimentChangedError,
                       match=r"(?s)config.train.num_steps: 10 -> 20.*config.train.stages"):
        experiment.check_resume(RECORDED, _with(train__num_steps=20, train__stages=[[5, {"a": 1}]]), "", "DIR", 4)


def test_a_derived_key_follows_the_key_the_user_changed_and_values_are_the_resumed_stages():
    """mask_rate 0.15 -> 0.3 under max_predictions_per_seq=auto changes the cap too (20 -> 39 at seq 128): the
    user is asked for mask_rate alone, the cap rides on its line, and accepting mask_rate accepts both."""
    recorded = _with(data__mask_rate=0.15, data__max_seq_length=64, data__max_predictions_per_seq=10)
    current = _with(data__mask_rate=0.3, data__max_seq_length=64, data__max_predictions_per_seq=20)
    stage_1 = (_with(data__mask_rate=0.15, data__max_seq_length=128, data__max_predictions_per_seq=20),
               _with(data__mask_rate=0.3, data__max_seq_length=128, data__max_predictions_per_seq=39))
    with pytest.raises(experiment.ExperimentChangedError) as refused:
        experiment.check_resume(recorded, current, "", "DIR", 300, quoted=stage_1, where="stage 2 of 2")
    first, *keys = str(refused.value).splitlines()
    assert first.endswith("--config.accept_changes=data.mask_rate") and "stage 2 of 2" in first
    assert keys == ["config.data.mask_rate: 0.15 -> 0.3 (data.max_predictions_per_seq: 20 -> 39: follows it)"]
    entry = experiment.check_resume(recorded, current, "data.mask_rate", "DIR", 300)
    assert entry["accepted"] == {"data.mask_rate": [0.15, 0.3], "data.max_predictions_per_seq": [10, 20]}
    # Set alone, the cap is the user's change, and asked for.
    with pytest.raises(experiment.ExperimentChangedError, match="accept_changes=data.max_predictions_per_seq"):
        experiment.check_resume(recorded, _with(data__mask_rate=0.15, data__max_seq_length=64,
                                                data__max_predictions_per_seq=12), "", "DIR", 300)


def test_mup_multipliers_and_a_bernoulli_cap_follow_the_keys_they_derive_from():
    """μP's resolved multipliers change with the width; under mask_count=bernoulli the auto cap is the row."""
    mup = {"parametrization": "mup", "mup_base_width": 64, "hidden_size": 128,
           "mup_multipliers": {"width_multiplier": 2.0, "hidden": {"lr": 0.5}}}
    recorded = _with(model=mup, data__mask_count="exact")
    current = _with(model=dict(mup, hidden_size=256, mup_multipliers={"width_multiplier": 4.0, "hidden": {"lr": 0.25}}),
                    data__mask_count="bernoulli", data__max_predictions_per_seq=64)
    with pytest.raises(experiment.ExperimentChangedError) as refused:
        experiment.check_resume(recorded, current, "", "DIR", 8)
    first, *keys = str(refused.value).splitlines()
    assert first.endswith("--config.accept_changes=data.mask_count,model.hidden_size")
    assert keys == ['config.data.mask_count: "exact" -> "bernoulli" (data.max_predictions_per_seq: 20 -> 64: follows it)',
                    "config.model.hidden_size: 128 -> 256 (model.mup_multipliers.hidden.lr: 0.5 -> 0.25; "
                    "model.mup_multipliers.width_multiplier: 2.0 -> 4.0: follows it)"]


def test_cadence_paths_and_logging_pass_and_are_recorded_as_passed():
    entry = experiment.check_resume(
        RECORDED, _with(train__log_every_steps=1, data__path="b", logging__wandb_mode="offline"), "", "DIR", 4)
    assert entry["accepted"] == {}
    assert entry["passed"] == {"data.path": ["a", "b"], "logging.wandb_mode": ["disabled", "offline"],
                               "train.log_every_steps": [5, 1]}
    assert experiment.check_resume(RECORDED, _with(), "", "DIR", 4) == {}  # nothing to record
    assert experiment.check_resume(None, _with(seed=3), "", "DIR", 0) is None  # a fresh start


def test_accepted_changes_go_through_only_for_the_keys_named():
    changed = _with(data__masking="token", seed=1)
    with pytest.raises(experiment.ExperimentChangedError, match=r"config.seed: 0 -> 1") as refused:
        experiment.check_resume(RECORDED, changed, "data.masking", "DIR", 4)
    assert "masking" not in str(refused.value)
    entry = experiment.check_resume(RECORDED, changed, "config.data.masking, seed", "DIR", 4)
    assert entry["accepted"] == {"data.masking": ["whole_word", "token"], "seed": [0, 1]} and entry["step"] == 4


def test_a_key_the_code_gained_since_the_start_is_not_a_change():
    current = _with()
    current["data"]["mixture"] = {}
    assert experiment.check_resume(RECORDED, current, "", "DIR", 4) == {}


@pytest.mark.slow  # two builds of the micro run: ~30 s alone on a quiet 2-core CPU, 90 s on a busy one
def test_resume_with_changed_masking_stops_and_with_the_flag_runs_and_keeps_the_history(tmp_path, xla_compile_cache):
    workdir = str(tmp_path / "run")
    c = micro_config()
    train_and_evaluate(c, workdir, stop_at_step=1)
    fraction = [r["train/masked_fraction"] for r in read_metrics(workdir) if "train/masked_fraction" in r]
    assert fraction and all(abs(f - 0.15) < 0.02 for f in fraction)  # the realised rate is logged
    changed = micro_config()
    changed.data.masking = "whole_word"
    with pytest.raises(experiment.ExperimentChangedError, match=r'config.data.masking: "token" -> "whole_word"'):
        train_and_evaluate(changed, workdir, stop_at_step=2)
    assert json.loads(Workdir(workdir).config_json.read_text())["data"]["masking"] == "token"  # untouched
    changed.accept_changes = "data.masking"
    train_and_evaluate(changed, workdir, stop_at_step=2)
    history = experiment.read_history(workdir)
    assert [e["event"] for e in history] == ["start", "resume"]
    assert history[0]["config"]["data"]["masking"] == "token"  # what ran first is kept
    assert history[1]["step"] == 1 and history[1]["accepted"] == {"data.masking": ["token", "whole_word"]}
    assert history[1]["passed"] == {"accept_changes": ["", "data.masking"]}
    assert json.loads(Workdir(workdir).config_json.read_text())["data"]["masking"] == "whole_word"
    assert max(r["step"] for r in read_metrics(workdir)) == 2
