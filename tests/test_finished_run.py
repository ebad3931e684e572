"""A finished run (DONE) is checked like any resume: a changed experiment is refused in at most three lines naming the
key the user changed, before any file is created or changed; an unchanged rerun says it is done and trains nothing;
a raised num_steps, accepted, trains on and is recorded."""
import hashlib
import os
import subprocess
import sys

import pytest

from bert_jax.run import experiment
from bert_jax.run.completion import read_done
from bert_jax.train.loop import train_and_evaluate

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)
from test_pretrain import micro_config  # noqa: E402
from test_staged_runs import _two_stage_micro  # noqa: E402



def _one_stage_micro():
    """configs/tiny.py shrunk (tests/test_pretrain.py), its prediction cap derived (`auto`) as tiny's is."""
    c = micro_config()
    c.data.max_predictions_per_seq = "auto"
    return c


CONFIGS = {"one_stage": _one_stage_micro, "two_stage": _two_stage_micro}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, xla_compile_cache):
    """{kind: (its config file, a workdir trained to its last step)}: configs/tiny.py and its two_stage, shrunk."""
    root = tmp_path_factory.mktemp("finished")
    out = {}
    for kind, make in CONFIGS.items():
        config_file = root / f"{kind}.py"
        config_file.write_text(f"import sys\nsys.path.insert(0, {TESTS!r})\nfrom {make.__module__} import "
                               f"{make.__name__}\n\n\ndef get_config():\n    return {make.__name__}()\n")
        workdir = str(root / kind)
        train_and_evaluate(make(), workdir)
        assert read_done(workdir) is not None
        out[kind] = (str(config_file), workdir)
    return out


def snapshot(workdir: str) -> dict:
    """Every file under `workdir`: its size, modification time and content hash."""
    out = {}
    for folder, _, names in os.walk(workdir):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, workdir)] = (os.path.getsize(path), os.stat(path).st_mtime_ns,
                                                       hashlib.sha256(f.read()).hexdigest())
    return out


def pretrain(config_file: str, workdir: str, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bert_jax.commands.pretrain", f"--config={config_file}",
                           f"--workdir={workdir}", *overrides], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow  # two micro runs trained to the end, then the command three times
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_a_finished_run_refuses_a_changed_mask_rate_in_three_lines_and_touches_nothing(finished, kind):
    config_file, workdir = finished[kind]
    before = snapshot(workdir)
    refused = pretrain(config_file, workdir, "--config.data.mask_rate=0.3")
    lines = refused.stderr.strip().splitlines()
    print(refused.stderr)
    assert refused.returncode == 2 and len(lines) <= 3 and "Traceback" not in refused.stderr
    assert "--config.accept_changes=data.mask_rate" in lines[0]  # the key the user set, alone
    assert lines[1].startswith("config.data.mask_rate: 0.15 -> 0.3")
    if kind == "two_stage":  # the values of the stage the run resumes into: seq 64, a cap of 10 -> 20
        assert "data.max_predictions_per_seq: 10 -> 20: follows it" in lines[1] and "stage 2 of 2" in lines[0]
    assert snapshot(workdir) == before
    accepted = pretrain(config_file, workdir, "--config.data.mask_rate=0.3", "--config.accept_changes=data.mask_rate")
    assert accepted.returncode == 2 and "would train nothing" in accepted.stderr, accepted.stderr[-2000:]
    assert snapshot(workdir) == before  # no success claimed for a run that never happened
    again = pretrain(config_file, workdir)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.strip().splitlines() == [f"done at step 8; nothing to train (DONE in {workdir})"]
    assert snapshot(workdir) == before


@pytest.mark.slow
def test_a_raised_num_steps_accepted_on_a_finished_run_trains_on_and_is_recorded(finished, tmp_path):
    import shutil

    _, done_workdir = finished["one_stage"]
    workdir = str(tmp_path / "run")
    shutil.copytree(done_workdir, workdir)
    longer = _one_stage_micro()
    longer.train.num_steps = 10
    with pytest.raises(experiment.ExperimentChangedError, match="accept_changes=train.num_steps"):
        train_and_evaluate(longer, workdir)
    longer.accept_changes = "train.num_steps"
    train_and_evaluate(longer, workdir)
    assert read_done(workdir)["step"] == 10
    resumed = experiment.read_history(workdir)[-1]
    assert resumed["step"] == 8 and resumed["accepted"] == {"train.num_steps": [8, 10]}


@pytest.mark.slow
def test_a_staged_run_trained_on_logs_its_stage_counted_from_one_with_resolved_values(finished, tmp_path, caplog):
    import shutil

    _, done_workdir = finished["two_stage"]
    workdir = str(tmp_path / "run")
    shutil.copytree(done_workdir, workdir)
    longer = _two_stage_micro()
    longer.train.num_steps, longer.accept_changes = 10, "train.num_steps"
    with caplog.at_level("INFO"):
        train_and_evaluate(longer, workdir)
    assert ("stage 2 of 2: steps 5 to 10, data.max_seq_length=64, train.global_batch_size=4, "
            "data.max_predictions_per_seq=10") in caplog.text  # not "stage 1 of 1", not "=auto"
    assert read_done(workdir)["step"] == 10
