"""A newcomer's mistakes, on every command: each ends with exit status 2 and at most three lines on stderr that name
the flag or key and the value, without a traceback, and leaves no file or directory behind (docs/design.md, "Fail
loudly, early, clearly").

All cases run in one subprocess, in turn, as the console script runs them (tests/test_cli.py's driver, which drops
the flags each command defined before the next), so JAX starts once. Each runs in a scratch folder whose tree is
compared before and after it. The library-level checks behind these messages are pinned beside their code
(tests/test_data_bad_input.py, tests/test_cloud_bad_input.py, tests/test_workdir.py); this is the user's view.
"""
import json
import os
import pathlib
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

import bert_jax.configs.tiny
from bert_jax import UserError
from bert_jax.run import command_line
from test_cli import DRIVER
from test_evaluate import write_glue
from test_workdir import write_config_as_a_run_does

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = f"--config={ROOT}/configs/tiny.py"
CLASSIFICATION = f"--config={ROOT}/configs/finetune/classification.py"
TEXT = "--config.data.source=text"

# tests/test_cli.py's driver (DRIVER), run with --track_files: the scratch folder's tree is taken around each command.

# (arguments after `bert-jax`, what stderr must name). Paths are relative to the scratch folder the driver runs in.
CASES = [
    # pretrain: the config is checked before the workdir is made (bert_jax/train/config_validation.py).
    (["pretrain", TINY, "--workdir=w", TEXT, "--config.data.path=nope/*.txt"], ["config.data.path", "nope/*.txt"]),
    (["pretrain", TINY, "--workdir=w", "--config.data.source=txt"], ["config.data.source", "txt"]),
    (["pretrain", TINY, "--workdir=w", "--config.train.optimizer=adamx"], ["config.train.optimizer", "adamx"]),
    (["pretrain", TINY, "--workdir=w", "--config.train.schedule=cosinex"], ["config.train.schedule", "cosinex"]),
    (["pretrain", TINY, "--workdir=w", "--config.model.family=bertx"], ["config.model.family", "bertx"]),
    (["pretrain", TINY, "--workdir=w", "--config.train.num_steps=many"], ["config.train.num_steps", "many"]),
    (["pretrain", TINY, "--workdir=w", "--config.model.num_heads=7"], ["num_heads=7"]),
    # a key the family's model leaves unread (bert_jax/models/unread.py)
    (["pretrain", f"--config={ROOT}/configs/modernbert_base.py:tiny", "--workdir=w", "--config.model.fused_qkv=true"],
     ["config.model.fused_qkv", "modernbert"]),
    (["pretrain", TINY, "--workdir=w", "--config.data.mask_rate=1.5"], ["mask_rate", "1.5"]),
    (["pretrain", TINY, "--workdir=w", "--config.data.mixture.a.source=text", "--config.data.mixture.a.path=corpus.txt",
      "--config.data.mixture.a.weight=-1"], ["weight", "-1"]),
    (["pretrain", TINY], ["--workdir"]),
    (["pretrain", TINY, "--workdir=w", "--learning_rate=1e-3"], ["learning_rate"]),
    (["pretrain", TINY, "--workdir=run_at_4", "--config.data.mask_rate=0.3"], ["mask_rate"]),
    (["pretrain", TINY, "--workdir=gs://no-such-bucket/run"], ["gs://no-such-bucket/run", "bucket"]),
    (["pretrain", TINY, "--workdir=w", TEXT, "--config.data.path=gs://no-such-bucket/corpus/*.txt"],
     ["config.data.path", "gs://no-such-bucket"]),
    # pretrain --config.branch_from: the parent's checkpoint and what a branch may change (bert_jax/train/branch.py).
    (["pretrain", TINY, "--workdir=w", "--config.branch_from=nope:4"], ["config.branch_from", "nope"]),
    (["pretrain", TINY, "--workdir=w", "--config.branch_from=run_at_4:7"], ["config.branch_from", "[4]"]),
    (["pretrain", TINY, "--workdir=w", "--config.branch_from=run_at_4:6"], ["config.branch_from", "unfinished write"]),
    (["pretrain", TINY, "--workdir=w", "--config.branch_from=run_at_4:4", "--config.model.hidden_size=256"],
     ["config.model.hidden_size", "shape"]),
    (["pretrain", TINY, "--workdir=w", "--config.branch_from=run_at_4:last", "--config.model.family=roberta"],
     ["config.model.family", "roberta"]),
    # finetune
    (["finetune", CLASSIFICATION, "--workdir=w", "--config.init_from=nope", "--config.data.train=corpus.txt"],
     ["config.init_from", "nope"]),
    # show-config: exits non-zero exactly where the run would refuse.
    (["show-config", TINY, "--config.train.optimizer=adamx"], ["config.train.optimizer", "adamx"]),
    (["show-config", TINY, "--config.data.source=txt"], ["config.data.source", "txt"]),
    (["show-config", TINY, TEXT, "--config.data.path=nope.txt"], ["config.data.path", "nope.txt"]),
    (["show-config", CLASSIFICATION, "--config.init_from=nope"], ["config.init_from", "nope"]),
    # evaluate
    (["evaluate", "--checkpoint=nope", "--suite=smoke", "--glue_dir=glue", "--out=e"], ["--checkpoint", "nope"]),
    (["evaluate", "--checkpoint=notarun", "--suite=nosuite", "--glue_dir=glue", "--out=e"], ["--suite", "nosuite"]),
    (["evaluate", "--checkpoint=notarun", "--suite=smoke", "--glue_dir=glue", "--tasks=nosuchtask", "--out=e"],
     ["--tasks", "nosuchtask"]),
    (["evaluate", "--checkpoint=notarun", "--suite=smoke", "--glue_dir=nope", "--out=e"], ["nope"]),
    (["evaluate", "--checkpoint=notarun", "--suite=smoke", "--out=e"], ["--glue_dir"]),
    (["evaluate", "--checkpoint=notarun", "--suite=smoke", "--glue_dir=glue", "--seeds=0", "--out=e"], ["--seeds=0"]),
    (["evaluate", "--checkpoint=notarun", "--suite=retrieval", "--out=e"], ["--beir_dir"]),
    (["evaluate", "--checkpoint=notarun", "--suite=retrieval", "--beir_dir=beir", "--out=e"],
     ["beir/docs/qrels/test.tsv", "row 3", "'d9'", "corpus.jsonl"]),
    # export
    (["export", "--workdir=nope", "--out=o"], ["nope"]),
    (["export", "--workdir=notarun", "--out=o"], ["notarun", "config.json"]),
    (["export", "--workdir=unfinished", "--out=o"], ["unfinished", "no checkpoint"]),
    (["export", "--workdir=run_at_4", "--step=99", "--out=o"], ["step 99", "[4]"]),
    (["export", "--workdir=run_at_4", "--format=onnx", "--out=o"], ["--format", "onnx"]),
    # average
    (["average", "--from=nope:4", "--out=o"], ["--from", "nope"]),
    (["average", "--from=run_at_4:4,run_at_4:last", "--weights=1", "--out=o"], ["--weights", "1 weights for 2"]),
    # finetune-export
    (["finetune-export", "--workdir=nope", "--out=o"], ["--workdir", "nope"]),
    (["finetune-export", "--workdir=run_at_4", "--out=o"], ["run_at_4", "pre-training run"]),
    # inspect
    (["inspect", "--from=nope", "--text=the [MASK] sat"], ["--from", "nope"]),
    (["inspect", "--from=run_at_4", "--text=the [MASK] sat", "--mode=pca"], ["--mode", "pca"]),
    (["inspect", "--from=run_at_4", "--mode=heads", "--corpus=nope.txt", "--out=h"], ["--corpus", "nope.txt"]),
    (["inspect", "--from=run_at_4", "--mode=heads"], ["--mode=heads", "--out"]),
    (["inspect", "--from=notarun", "--mode=heads", "--out=h"], ["--from", "notarun", "--corpus"]),
    # plan
    (["plan", TINY, "--search"], ["--search", "--tpu"]),
    (["plan", TINY, "--tpu=v9-8"], ["--tpu", "v9-8"]),
    (["plan", TINY, "--num_devices=0"], ["--num_devices=0"]),
    # prepare, prepare-beam, tokenizer
    (["prepare", TINY, "--out=o", TEXT, "--config.data.path=nope.txt"], ["config.data.path", "nope.txt"]),
    (["prepare", TINY, "--out=o", TEXT, "--config.data.path=corpus.txt", "--num_workers=0"], ["--num_workers=0"]),
    (["prepare", TINY, "--out=prepared_other", TEXT, "--config.data.path=corpus.txt"],
     ["prepared_other", "other settings"]),
    (["prepare-beam", TINY, "--out=o", TEXT, "--config.data.path=nope.txt"], ["config.data.path", "nope.txt"]),
    (["tokenizer", TINY, "--out=o", TEXT, "--config.data.path=nope.txt"], ["config.data.path", "nope.txt"]),
    (["tokenizer", TINY, "--out=o", "--config.data.tokenizer.kind=bpex"], ["config.data.tokenizer.kind", "bpex"]),
    # extend-vocab
    (["extend-vocab", "--from=notarun", "--corpus=nope.txt", "--add=5", "--out=o"], ["--corpus", "nope.txt"]),
    (["extend-vocab", "--from=nope", "--corpus=corpus.txt", "--add=5", "--out=o"], ["--from", "nope"]),
    (["extend-vocab", "--from=notarun", "--corpus=corpus.txt", "--add=0", "--out=o"], ["--add=0"]),
    (["mine-pairs", "--out=o", "--sentences=0"], ["--sentences=0"]),
    # sweep
    (["sweep", "summary", "--sweep_dir=nope"], ["nope"]),
]
VERBOSE = ["export", "--workdir=nope", "--out=o", "--verbose"]


def scratch_folder(root: pathlib.Path) -> None:
    """What the cases name: a corpus, folders that are no run, a run that saved nothing, a run at step 4, a GLUE
    folder, a broken BEIR folder, and a prepared output with other settings."""
    (root / "corpus.txt").write_text("The cat sat on the mat.\nIt was warm.\n\nA dog barked.\nThen it slept.\n")
    (root / "notarun").mkdir()
    (root / "notarun" / "notes.txt").write_text("not a run\n")
    write_glue(root / "glue", n_train=8, n_dev=4)
    (root / "beir" / "docs" / "qrels").mkdir(parents=True)  # a BEIR folder whose qrels name a document it lacks
    (root / "beir" / "docs" / "corpus.jsonl").write_text('{"_id": "d1", "title": "", "text": "a cat"}\n')
    (root / "beir" / "docs" / "queries.jsonl").write_text('{"_id": "q1", "text": "cat"}\n')
    (root / "beir" / "docs" / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td9\t1\n")
    (root / "unfinished").mkdir()
    write_config_as_a_run_does(root / "unfinished", bert_jax.configs.tiny.get_config())
    (root / "run_at_4" / "checkpoints" / "4").mkdir(parents=True)  # a committed step, as orbax lists them
    (root / "run_at_4" / "checkpoints" / "6.orbax-checkpoint-tmp-1").mkdir()  # a save that never committed
    write_config_as_a_run_does(root / "run_at_4", bert_jax.configs.tiny.get_config())
    (root / "prepared_other").mkdir()
    (root / "prepared_other" / "prepare_plan.json").write_text(json.dumps({"num_parts": 7, "docs_per_shard": 1}))


@pytest.fixture(scope="module")
def ran(tmp_path_factory, gcs):  # gs:// answered by the local emulator (tests/cloud_emulators.py), which has no bucket
    root = tmp_path_factory.mktemp("bad_input")
    scratch_folder(root)
    env = {k: v for k, v in os.environ.items() if k != command_line.VERBOSE_ENV}
    runs = [args for args, _ in CASES] + [VERBOSE]
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(runs), "--track_files"], capture_output=True, text=True,
                          timeout=600, cwd=root, env=dict(env, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_matrix_covers_every_command_a_newcomer_meets():
    commands = {args[0] for args, _ in CASES}
    assert len(CASES) >= 25 and len(commands) >= 10, (len(CASES), sorted(commands))


@pytest.mark.parametrize("args, names", CASES, ids=[" ".join(a[:1] + [x for x in a[1:] if "configs/" not in x])
                                                     for a, _ in CASES])
def test_a_mistake_is_at_most_three_lines_naming_it_with_status_2_and_nothing_created(ran, args, names):
    result = ran[" ".join(args)]
    lines = result["err"].strip().splitlines()
    shown = f"exit {result['code']}, stderr:\n{result['err']}"
    assert result["code"] == 2, shown
    assert 1 <= len(lines) <= 3 and "Traceback" not in result["err"], shown
    assert all(name in result["err"] for name in names), f"{names} not named: {shown}"
    assert result["created"] == [] and result["removed"] == [], (result["created"], result["removed"])


# A case of each command that reaches its main (past the flags) before it refuses the input.
SET_UP = {"pretrain": "--config.model.num_heads=7", "prepare": "--config.data.path=nope.txt",
          "tokenizer": "--config.data.path=nope.txt", "extend-vocab": "--from=nope", "mine-pairs": "--sentences=0"}


@pytest.mark.parametrize("command", SET_UP)
def test_a_command_sets_its_process_up_first_as_the_training_commands_do(ran, command):
    """The process setup (bert_jax/run/process_setup.py: the allocator's two arenas, the config's flags) is each
    command's first act, the data commands' too; the driver clears its mark before each command."""
    [result] = [r for args, r in ran.items() if args.split()[0] == command and SET_UP[command] in args.split()]
    assert result["arenas"] == "2", result


def test_a_missing_bucket_is_not_made(ran):
    emulator = os.environ["STORAGE_EMULATOR_HOST"]
    with pytest.raises(urllib.error.HTTPError) as answer:
        urllib.request.urlopen(f"{emulator}/storage/v1/b/no-such-bucket")
    assert answer.value.code == 404


def test_verbose_shows_the_traceback_too(ran):
    result = ran[" ".join(VERBOSE)]
    assert result["code"] == 2 and "Traceback" in result["err"]
    assert result["err"].strip().splitlines()[-1].startswith("bert-jax export: nope/config.json does not exist")


def test_the_environment_variable_shows_the_traceback_too(monkeypatch, capsys):
    monkeypatch.setenv(command_line.VERBOSE_ENV, "1")
    with pytest.raises(SystemExit) as exit_:
        try:
            raise UserError("--workdir=nope: not a run's directory")
        except UserError as error:
            command_line.refuse(["bert_jax/commands/export.py"], error)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" in err
    assert err.splitlines()[-1] == "bert-jax export: --workdir=nope: not a run's directory"


def test_a_long_message_is_cut_to_three_lines_saying_how_to_see_the_rest(monkeypatch, capsys):
    monkeypatch.delenv(command_line.VERBOSE_ENV, raising=False)
    with pytest.raises(SystemExit):
        command_line.refuse(["bert_jax/commands/pretrain.py"], UserError("\n".join(f"key_{i} changed" for i in range(9))))
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["bert-jax pretrain: key_0 changed", "key_1 changed", "... and 7 more lines (--verbose shows them)"]
