"""s3:// checkpoints: orbax writes them through TensorStore's S3 driver, committed by a marker object.

orbax 0.12 knows one object store, gs://. Given s3://b/run it takes the path for a local
one (`s3:/b/run`) and, on save, either fails or writes to the local disk. Two things are
missing, and both exist below orbax:

- **Arrays**: TensorStore has an `s3` kvstore driver. orbax asks one function for the
  kvstore of a remote checkpoint path (`gcs_utils.get_kvstore_for_gcs`, after
  `tensorstore_utils._use_gcs_driver` says the path is remote); for s3 paths those now
  answer with the S3 driver, its endpoint and region from `AWS_ENDPOINT_URL` and
  `AWS_REGION` (credentials: TensorStore reads the usual AWS variables and profiles).
- **Commit**: S3 has no rename, so a checkpoint cannot appear whole by renaming its
  temporary folder (a killed "rename" is a copy left half done). orbax's answer for gs://
  is the commit file: the step folder is written in place and counts only once its
  `commit_success.txt` exists, the last object written. s3 paths now get the same.

Chosen over staging each checkpoint on local disk and uploading it: on a pod every host
writes its own shards and process 0 merges their indexes, which needs one store that all
hosts see; a local staging folder is not one. The metadata files orbax writes itself go
through `epath` (s3fs), like every other path here.

`install()` patches those four orbax functions, once per process, when
`bert_jax.checkpoint` is imported. orbax is pinned below 0.13 (pyproject.toml); the
s3 tests (tests/test_cloud_pretrain.py) fail if a new orbax moves them.
"""
from __future__ import annotations

import os

from orbax.checkpoint._src.path import atomicity, atomicity_defaults, gcs_utils
from orbax.checkpoint._src.serialization import tensorstore_utils

# orbax normalises paths with os.path.normpath, which turns s3://b/x into s3:/b/x.
_S3_PREFIXES = ("s3://", "s3:/")


def is_s3(path) -> bool:
    return str(path).startswith(_S3_PREFIXES)


def kvstore_spec(path: str) -> dict:
    """TensorStore's S3 kvstore for `s3://bucket/key`, at $AWS_ENDPOINT_URL (an S3-compatible store) if set."""
    bucket, _, key = str(path).split(":/", 1)[1].lstrip("/").partition("/")
    spec = {"driver": "s3", "bucket": bucket, "path": key}
    if os.environ.get("AWS_ENDPOINT_URL"):
        spec["endpoint"] = os.environ["AWS_ENDPOINT_URL"]
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        spec["aws_region"] = region
    return spec


# Why s3:// checkpoints cannot be written in this process, or "" when they can (see install).
UNAVAILABLE = ""
_HOOKS = ((tensorstore_utils, "_use_gcs_driver"), (gcs_utils, "get_kvstore_for_gcs"),
          (atomicity_defaults, "get_default_temporary_path_class"),
          (atomicity_defaults, "get_item_default_temporary_path_class"))


def check_supported(directory) -> None:
    """Fails naming the checkpoint folder when it is on s3:// and this orbax could not be taught S3."""
    if is_s3(directory) and UNAVAILABLE:
        raise RuntimeError(f"cannot checkpoint to {directory}: {UNAVAILABLE}")


def install() -> None:
    global UNAVAILABLE
    if getattr(tensorstore_utils, "_bert_jax_s3", False):
        return
    # Another orbax (a GPU image's, say) may lack the private hooks: everything but s3:// checkpoints still
    # works, so importing the package must not fail; a run that checkpoints to s3:// fails naming this.
    missing = [f"{module.__name__}.{name}" for module, name in _HOOKS if not hasattr(module, name)]
    if missing:
        UNAVAILABLE = (f"this orbax-checkpoint lacks {', '.join(missing)}, which s3:// checkpoints patch "
                       "(bert_jax/checkpoint/s3_store.py); install the pinned orbax-checkpoint<0.13")
        return
    uses_remote_driver = tensorstore_utils._use_gcs_driver
    gcs_kvstore = gcs_utils.get_kvstore_for_gcs
    default_class = atomicity_defaults.get_default_temporary_path_class
    item_default_class = atomicity_defaults.get_item_default_temporary_path_class

    def commit_file_for_s3(default):
        def temporary_path_class(path, *, atomicity_options=None):
            if is_s3(path) and (atomicity_options is None or atomicity_options.mode == "auto"):
                return atomicity.CommitFileTemporaryPath
            return default(path, atomicity_options=atomicity_options)
        return temporary_path_class

    tensorstore_utils._use_gcs_driver = lambda directory: is_s3(directory) or uses_remote_driver(directory)
    gcs_utils.get_kvstore_for_gcs = lambda path: kvstore_spec(path) if is_s3(path) else gcs_kvstore(path)
    atomicity_defaults.get_default_temporary_path_class = commit_file_for_s3(default_class)
    atomicity_defaults.get_item_default_temporary_path_class = commit_file_for_s3(item_default_class)
    tensorstore_utils._bert_jax_s3 = True
