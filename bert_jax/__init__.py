"""bert_jax: pre-training BERT-family encoders with JAX and Flax linen.

The package root holds the console script (`cli`), the family registry (`families`), the generic registry helper
(`registry`) and `UserError`. Every command is a module of `commands/`; the library is the subpackages, bottom layer
first: `storage`; `models`, `objectives`, `parallel`; `checkpoint`, `hf`; `run`; `train`; `finetune`, `vocab`;
`plan` (docs/dev/architecture.md).
"""
import glob
import importlib.util
import os
import sys

# Hosts that have libtpu (the `tpu` extra, for `plan --tpu`) but no TPU: JAX would try the TPU backend first
# in every process, costing about 0.2 s and a screen of libtpu errors before it falls back to the CPU.
_TPU_HINTS = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TPU_NAME", "TPU_SKIP_MDS_QUERY_FOR_TEST")


def _cpu_only_without_a_tpu() -> None:
    if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
        return
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") or any(os.environ.get(k) for k in _TPU_HINTS):
        return  # a TPU VM (or one says so): leave the choice to JAX
    if any(importlib.util.find_spec(p) for p in ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin",
                                                 "jax_rocm7_plugin")):
        return  # a GPU build of JAX: its plugin decides
    if "jax" in sys.modules:
        sys.modules["jax"].config.update("jax_platforms", "cpu")
    else:
        os.environ["JAX_PLATFORMS"] = "cpu"


_cpu_only_without_a_tpu()


class UserError(ValueError):
    """A mistake in what the user asked for (a key, a flag, a path): a command prints its message, at most three
    lines naming the culprit, the value and what is accepted, and exits with status 2, before it creates anything.
    (A ValueError, so callers that catch those keep working.)"""
