"""The CPU for a command's JAX on a host that has libtpu but no TPU.

libtpu is installed wherever `plan --tpu` compiles for a slice (the `tpu` extra, and the test extra), TPU VM or not.
On a host without a TPU, JAX would still try the TPU backend first in every process: about 0.2 s and a screen of
libtpu errors before it falls back to the CPU. A command chooses at its start (bert_jax/run/command_line.py's `run`);
`import bert_jax` leaves the environment alone, so a program that imports the library decides for itself.
"""
import glob
import importlib.util
import os
import sys

# Set on TPU VMs (or by whoever says the host has one): then JAX chooses.
TPU_HINTS = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID", "TPU_WORKER_HOSTNAMES", "TPU_NAME", "TPU_SKIP_MDS_QUERY_FOR_TEST")
GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin")


def libtpu_without_a_tpu() -> bool:
    """libtpu is installed, but this host has no TPU device and no JAX GPU plugin, and nobody chose a platform."""
    if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
        return False
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") or any(os.environ.get(k) for k in TPU_HINTS):
        return False  # a TPU VM (or one says so)
    return not any(importlib.util.find_spec(plugin) for plugin in GPU_PLUGINS)  # a GPU build: its plugin decides


def cpu_without_a_tpu() -> None:
    """JAX_PLATFORMS=cpu where `libtpu_without_a_tpu()`, for this process (even with jax imported, before its
    backend starts) and the processes it starts (on the same host, so the same answer)."""
    if not libtpu_without_a_tpu():
        return
    os.environ["JAX_PLATFORMS"] = "cpu"
    if "jax" in sys.modules:  # jax read the variable when it was imported
        sys.modules["jax"].config.update("jax_platforms", "cpu")
