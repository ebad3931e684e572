"""Pre-training with the workdir and the corpus in a bucket (emulated, see cloud_emulators.py).

A run in gs:// must give the very losses of the same run on local disk, leave nothing
local behind, and resume from the bucket. Runs go through the user's command
(`python -m bert_jax.commands.pretrain`) in subprocesses that share one XLA compilation cache,
so the second run of a program does not compile it again.
"""
import gzip
import os
import random
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax.storage import paths
from bert_jax.checkpoint.params import restore_params
from bert_jax.families import model_for
from bert_jax.storage.workdir import Workdir
from bert_jax.run import goodput
from bert_jax.run.metrics_file import read_rows
from data_pipelines.sources import corpus
from test_parallel_mesh import FAST_COMPILE
from test_pretrain import REPO, micro_overrides


def write_corpus(root: str, num_files: int = 3) -> str:
    """Part of the embedded corpus as gzipped text files under `root`; returns their glob."""
    documents = list(corpus.embedded_documents())[:300]
    for i in range(num_files):
        text = "\n\n".join("\n".join(d) for d in documents[i::num_files]) + "\n"
        paths.write_atomically(paths.path(root) / "corpus" / f"part-{i}.txt.gz", gzip.compress(text.encode()))
    return f"{root}/corpus/*.txt.gz"


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla_cache"))


def pretrain(workdir: str, corpus_glob: str, xla_cache: str, *flags: str, background: bool = False, cwd=REPO):
    command = [sys.executable, "-m", "bert_jax.commands.pretrain", f"--config={REPO}/configs/tiny.py", f"--workdir={workdir}",
               *micro_overrides(), "--config.data.source=text", f"--config.data.path={corpus_glob}",
               "--config.train.num_steps=4", "--config.train.eval_every_steps=4", "--config.checkpoint.every_steps=2",
               "--config.logging.tensorboard=True", *flags]
    env = dict(os.environ, PYTHONPATH=REPO, XLA_FLAGS=FAST_COMPILE, JAX_COMPILATION_CACHE_DIR=xla_cache,
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    if background:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def losses(workdir) -> list:
    return [(r["step"], r["train/loss"]) for r in read_rows(paths.path(workdir) / "metrics.jsonl") if "train/loss" in r]


def share_tokenizer(src_workdir, dst: str) -> str:
    """Copies a run's tokenizer to `dst` (WordPiece training breaks ties in hash order: runs to compare share one)."""
    for f in (paths.path(src_workdir) / "tokenizer").iterdir():
        paths.copy_file(f, paths.path(dst) / f.name)
    return dst


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, xla_cache):
    root = tmp_path_factory.mktemp("local")
    workdir = str(root / "run")
    pretrain(workdir, write_corpus(str(root)), xla_cache)
    return workdir


@pytest.fixture(scope="module")
def gs_run(gcs, xla_cache, tmp_path_factory):
    """A run with workdir and corpus in gs://, started from an empty folder: (workdir, corpus glob, that folder)."""
    bucket, cwd = gcs.new(), tmp_path_factory.mktemp("cwd")
    before = set(os.listdir(REPO))
    corpus_glob = write_corpus(bucket)
    # Two steps, a checkpoint after each: the least that still resumes and keeps max_to_keep's history.
    pretrain(f"{bucket}/run", corpus_glob, xla_cache, "--config.train.num_steps=2", "--config.checkpoint.every_steps=1",
             "--config.train.eval_every_steps=2", "--config.train.profile.start_step=2",
             "--config.train.profile.num_steps=1", cwd=str(cwd))
    assert set(os.listdir(REPO)) == before  # a stray `gs:` folder from a URL taken as a relative path would show
    return f"{bucket}/run", corpus_glob, cwd


def test_a_run_with_workdir_and_corpus_in_gs_writes_everything_there_and_nothing_local(gs_run):
    workdir, _, cwd = gs_run
    run = paths.path(workdir)
    assert [step for step, _ in losses(run)] == [1, 2]
    assert {p.name for p in run.iterdir()} >= {"config.json", "metrics.jsonl", "checkpoints", "tokenizer", "plots",
                                               "tensorboard"}
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["1", "2"]
    assert any((run / "tensorboard").iterdir()) and (run / "plots" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(cwd.iterdir())
    (traced,) = (run / "profile" / "plugins" / "profile").iterdir()  # traced to local disk, then copied whole
    assert any(p.name.endswith(".xplane.pb") for p in traced.iterdir())
    (record,) = goodput.read(workdir)  # one object per start, replaced whole: no append
    assert (record.start_step, record.step) == (0, 2) and goodput.report(workdir)[-1].startswith("goodput ")


def test_a_workdir_in_gs_restores_the_params_its_newest_checkpoint_saved(gs_run):
    run = Workdir(gs_run[0])
    assert str(run.checkpoints) == f"{gs_run[0]}/checkpoints"
    assert run.config().train.num_steps == 2
    params, step = restore_params(run, model_for)
    saved = ocp.PyTreeCheckpointer().restore(paths.absolute(run.checkpoints / "2" / "state"))["params"]
    assert step == 2 and jax.tree.structure(params) == jax.tree.structure(saved)
    jax.tree.map(lambda ours, theirs: np.testing.assert_array_equal(ours, np.asarray(theirs)), params, saved)


@pytest.mark.slow
def test_a_run_in_a_bucket_gives_the_local_losses_bit_for_bit(gcs, local_run, xla_cache):
    bucket = gcs.new()
    tokenizer = share_tokenizer(local_run, f"{bucket}/tokenizer")
    pretrain(f"{bucket}/run", write_corpus(bucket), xla_cache, f"--config.data.tokenizer.path={tokenizer}")
    assert len(losses(local_run)) == 4
    assert losses(f"{bucket}/run") == losses(local_run)


@pytest.mark.slow
def test_a_corpus_and_tokenizer_in_s3_give_the_local_losses_bit_for_bit(s3, local_run, xla_cache, tmp_path):
    """s3:// inputs, local workdir."""
    bucket = s3.new()
    tokenizer = share_tokenizer(local_run, f"{bucket}/tokenizer")
    pretrain(str(tmp_path / "run"), write_corpus(bucket), xla_cache, f"--config.data.tokenizer.path={tokenizer}")
    assert losses(tmp_path / "run") == losses(local_run)


def stored_bytes(folder) -> int:
    return sum(stored_bytes(p) if p.is_dir() else p.stat().length for p in folder.iterdir())


@pytest.fixture(scope="module")
def s3_run(s3, xla_cache, tmp_path_factory):
    """gs_run's run with workdir and corpus in s3:// (orbax writes through TensorStore's S3 driver)."""
    bucket = s3.new()
    corpus_glob = write_corpus(bucket)
    pretrain(f"{bucket}/run", corpus_glob, xla_cache, "--config.train.num_steps=2", "--config.checkpoint.every_steps=1",
             "--config.train.eval_every_steps=2")
    return f"{bucket}/run", corpus_glob, None


@pytest.mark.slow  # ~41 s of run: the gs:// runs above keep the bucket path in the default suite
def test_a_workdir_in_s3_holds_committed_checkpoints_that_restore_the_saved_params(s3_run):
    run = Workdir(s3_run[0])
    assert [step for step, _ in losses(run.root)] == [1, 2]
    assert {p.name for p in run.root.iterdir()} >= {"config.json", "metrics.jsonl", "checkpoints", "tokenizer", "DONE"}
    # S3 has no rename: each step folder is written in place and committed by its marker object, last.
    assert run.checkpoint_steps() == [1, 2]
    assert all((run.checkpoints / str(step) / "commit_success.txt").exists() for step in (1, 2))
    assert stored_bytes(run.checkpoints / "2" / "state") > 50_000  # the arrays themselves are in the bucket
    params, step = restore_params(run, model_for)
    saved = ocp.PyTreeCheckpointer().restore(paths.absolute(run.checkpoints / "2" / "state"))["params"]
    assert step == 2
    jax.tree.map(lambda ours, theirs: np.testing.assert_array_equal(ours, np.asarray(theirs)), params, saved)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["gcs", "s3"])
def test_sigkill_then_the_same_command_resumes_from_the_bucket_bit_for_bit(store, request, local_run, xla_cache):
    """3 trials: SIGKILL the run in the bucket at a random moment, resume with the same command."""
    bucket = request.getfixturevalue(store).new()
    tokenizer = share_tokenizer(local_run, f"{bucket}/tokenizer")
    corpus_glob = write_corpus(bucket)
    longer = ["--config.train.num_steps=16", "--config.train.eval_every_steps=8",
              f"--config.data.tokenizer.path={tokenizer}"]
    pretrain(f"{bucket}/reference", corpus_glob, xla_cache, *longer)
    expected = losses(f"{bucket}/reference")
    assert [step for step, _ in expected] == list(range(1, 17))
    rng, kills = random.Random(0), 0
    for _ in range(3):
        proc = pretrain(f"{bucket}/killed", corpus_glob, xla_cache, *longer, background=True)
        for line in proc.stderr:
            if "starting at step" in line:
                break
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        time.sleep(rng.uniform(0.3, 2.0))
        if proc.poll() is None:
            proc.kill()
            kills += 1
        proc.wait(timeout=600)
    assert kills >= 2
    pretrain(f"{bucket}/killed", corpus_glob, xla_cache, *longer)
    assert losses(f"{bucket}/killed") == expected


@pytest.mark.slow
@pytest.mark.parametrize("bucket_run", ["gs_run", "s3_run"])
def test_export_to_a_bucket_and_init_from_hf_from_it_give_the_trained_logits(bucket_run, request, xla_cache, tmp_path):
    import numpy as np
    import transformers

    from bert_jax.hf import folder as hf_folder
    from bert_jax.storage.workdir import Workdir
    from bert_jax.families import get_family

    workdir, corpus_glob, _ = request.getfixturevalue(bucket_run)
    out = workdir.rsplit("/", 1)[0] + "/hf"
    exported = subprocess.run([sys.executable, "-m", "bert_jax.commands.export", f"--workdir={workdir}", f"--out={out}"],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
    assert exported.returncode == 0, exported.stderr[-3000:]
    local = tmp_path / "hf"
    for f in paths.path(out).iterdir():
        paths.copy_file(f, local / f.name)
    # init_from_hf=gs://...: learning rate 0, so the new run's checkpoint holds exactly the imported params.
    pretrain(f"{workdir}_from_hf", corpus_glob, xla_cache, f"--config.init_from_hf={out}",
             "--config.train.learning_rate=0", "--config.train.warmup_steps=0", "--config.train.num_steps=1",
             "--config.checkpoint.every_steps=1", "--config.train.eval_every_steps=1")
    config = Workdir(workdir).config()
    trained, _ = restore_params(Workdir(workdir), model_for)
    imported, _ = restore_params(Workdir(f"{workdir}_from_hf"), model_for)
    model = get_family("bert").build_model(config.model)
    tokenizer = transformers.AutoTokenizer.from_pretrained(local)
    enc = tokenizer("the python [MASK] is a list", return_tensors="np")
    batch = {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    batch["masked_positions"] = np.array([[int(np.argmax(enc["input_ids"][0] == tokenizer.mask_token_id))]], np.int32)
    logits = [np.asarray(model.apply({"params": p}, batch, deterministic=True)["mlm_logits"])
              for p in (trained, imported)]
    np.testing.assert_array_equal(logits[0], logits[1])
    assert hf_folder.read_hf_config(out)["model_type"] == "bert"


@pytest.mark.slow
@pytest.mark.parametrize("store", ["gcs", "s3"])
def test_two_processes_share_one_bucket_workdir_and_resume_together(store, request):
    import io

    from bert_jax.launch.local import run_local

    workdir = f"{request.getfixturevalue(store).new()}/run"
    out = io.StringIO()
    command = [sys.executable, "-m", "bert_jax.commands.pretrain", "--config=configs/tiny.py", f"--workdir={workdir}",
               *micro_overrides()]
    status = run_local(command, num_processes=2, devices_per_process=1, out=out, timeout_s=900)
    assert status == 0, out.getvalue()[-4000:]
    steps = [step for step, _ in losses(workdir)]
    assert steps == list(range(1, 9))  # process 0 alone writes metrics: no step twice
    checkpoints = paths.path(workdir) / "checkpoints"
    assert sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) == [4, 8]
    assert sorted(p.name for p in (checkpoints / "8" / "data").iterdir() if p.name.endswith(".json")) == \
        ["process_0-of-2.json", "process_1-of-2.json"]  # each process wrote its own iterator state
    status = run_local(command + ["--config.train.num_steps=10"], num_processes=2, devices_per_process=1, out=out,
                       timeout_s=900)
    assert status == 0, out.getvalue()[-4000:]
    assert "starting at step 8 of 10" in out.getvalue()
    assert [step for step, _ in losses(workdir)] == list(range(1, 11))
