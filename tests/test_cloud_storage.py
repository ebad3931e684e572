"""The path layer: user paths reach buckets only through bert_jax.storage (etils.epath), and
what lives in a bucket (prepared shards, corpora, sweep summaries) reads as it does locally."""
import ast
import logging
import pathlib

import numpy as np
import pytest

from bert_jax.storage import paths
from data_pipelines.sources import prepared
from test_data_prepare import corpus_cfg, run_prepare, write_corpus

REPO = pathlib.Path(__file__).resolve().parent.parent
# Calls that take a path and know only local disk. On a user path they turn gs://b/x into
# a local folder `gs:/b/x` (os.path.abspath) or fail; bert_jax.storage.paths does it right.
LOCAL_ONLY_CALLS = {"open", "gzip.open", "glob.glob", "glob.iglob", "shutil.copy", "shutil.copy2", "shutil.copyfile",
                    "shutil.copytree", "shutil.rmtree", "shutil.move", "os.makedirs", "os.listdir", "os.remove",
                    "os.rename", "os.replace", "os.walk", "os.unlink", "os.scandir", "os.mkdir"}
# Files whose paths are never a user's: the embedded corpus reads Python's own library;
# a SLURM script and its logs live on the cluster's shared disk, which sbatch reads; the package looks for
# this host's TPU device files (/dev/accel*); the loader's worker watch reads /proc for its child processes.
NOT_USER_PATHS = {"data_pipelines/sources/corpus.py", "launch/slurm.py", "bert_jax/commands/slurm.py",
                  "bert_jax/run/backend_choice.py",
                  "data_pipelines/loader/workers.py"}


def _call_name(node: ast.Call) -> str:
    parts, func = [], node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    return ".".join([func.id, *reversed(parts)]) if isinstance(func, ast.Name) else ""


def test_user_paths_never_meet_local_only_file_calls():
    found = []
    for root in ("bert_jax", "data_pipelines", "launch"):
        for f in sorted((REPO / root).rglob("*.py")):
            relative = f.relative_to(REPO).as_posix()
            if relative in NOT_USER_PATHS:
                continue
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Call):
                    name = _call_name(node)
                    if name in LOCAL_ONLY_CALLS or name.startswith("os.path."):
                        found.append(f"{relative}:{node.lineno} {name}")
    assert not found, "use bert_jax.storage.paths (etils.epath) for paths a user may give as gs:// or s3://: " + \
        ", ".join(found)


def test_prepared_shards_in_a_bucket_read_through_a_logged_local_cache(gcs, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(paths.CACHE_ENV, str(tmp_path / "cache"))
    cfg = corpus_cfg(write_corpus(tmp_path / "corpus"))
    local = run_prepare(cfg, tmp_path / "local")
    bucket = gcs.new()
    (tmp_path / "local" / "tokenizer").rename(tmp_path / "tokenizer")  # the same tokenizer in both
    for f in (tmp_path / "tokenizer").iterdir():
        paths.copy_file(f, f"{bucket}/prepared/tokenizer/{f.name}")
    remote = run_prepare(cfg, f"{bucket}/prepared")
    assert remote["shards"] == local["shards"]
    with caplog.at_level(logging.INFO):
        documents = prepared.PreparedDocuments(f"{bucket}/prepared")
        assert not (tmp_path / "cache").exists()  # Shards are copied when first read.
        documents[0]
    assert "the reader needs a local file" in caplog.text and (tmp_path / "cache").exists()
    want = prepared.PreparedDocuments(str(tmp_path / "local"))
    assert len(documents) == len(want) == local["documents"]
    for i in range(len(want)):
        assert all(np.array_equal(a, b) for a, b in zip(documents[i], want[i]))


def test_an_orbax_without_the_s3_hooks_still_imports_and_refuses_s3_checkpoints_by_name(monkeypatch):
    """A GPU image's newer orbax lacks a private hook: the package must import, and s3:// must fail clearly."""
    from orbax.checkpoint._src.serialization import tensorstore_utils

    from bert_jax.checkpoint import manager, s3_store

    monkeypatch.setattr(s3_store, "UNAVAILABLE", "")
    monkeypatch.setattr(tensorstore_utils, "_bert_jax_s3", False)
    monkeypatch.delattr(tensorstore_utils, "_use_gcs_driver")
    s3_store.install()
    with pytest.raises(RuntimeError, match=r"s3://b/run/checkpoints: .*_use_gcs_driver"):
        manager.make_manager("s3://b/run/checkpoints", None)


@pytest.mark.parametrize("store", ["gcs", "s3"])
def test_a_folder_moves_whole_in_a_bucket(store, request):
    """How a corrupt checkpoint is set aside (bert_jax/checkpoint/manager.py): on S3, fsspec's recursive rename
    copied the prefixes it listed as objects and failed (NoSuchKey), which ended a resume that should fall back."""
    root = paths.path(request.getfixturevalue(store).new()) / "run" / "checkpoints"
    files = {"15/state/manifest.ocdbt": b"m", "15/state/ocdbt.process_0/d/ab12": b"x" * 100, "15/meta.json": b"{}"}
    for name, data in files.items():
        paths.write_atomically(root / name, data)
    paths.move_tree(root / "15", root / "15.corrupt")
    moved = paths.fresh(root / "15.corrupt")
    assert {str(f.relative_to(moved)): f.read_bytes() for f in paths.files_under(moved)} == {
        name.removeprefix("15/"): data for name, data in files.items()}
    assert sorted(p.name for p in paths.fresh(root).iterdir()) == ["15.corrupt"]
