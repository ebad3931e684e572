"""The GPU determinism switch: config.deterministic_gpu_ops -> XLA's --xla_gpu_deterministic_ops.

On a GPU, XLA may autotune (time several kernels for a fusion or matmul and keep the fastest,
which can differ from run to run) and use atomics (scatter-add, some reductions) whose float
sums depend on thread timing. --xla_gpu_deterministic_ops=true turns both off, at a cost in
speed (bench/deterministic_ops_cost.py measures it). CPUs and TPUs are deterministic without
it; there the flag does nothing.

XLA reads XLA_FLAGS once, when JAX starts its backend, so the flag must be set before anything
touches a device: `bert_jax.commands.pretrain` does it right after parsing the config.
"""
import os

FLAG = "--xla_gpu_deterministic_ops=true"


def set_xla_flags(config) -> None:
    """Adds FLAG to XLA_FLAGS when config.deterministic_gpu_ops asks; call before JAX starts."""
    flags = os.environ.get("XLA_FLAGS", "")
    if config.deterministic_gpu_ops and FLAG not in flags.split():
        os.environ["XLA_FLAGS"] = f"{flags} {FLAG}".strip()


def check_xla_flags(config) -> None:
    """Fails when config.deterministic_gpu_ops is set but XLA did not get the flag."""
    if config.deterministic_gpu_ops and FLAG not in os.environ.get("XLA_FLAGS", "").split():
        raise ValueError(
            f"config.deterministic_gpu_ops=True but XLA_FLAGS lacks {FLAG}: XLA reads its flags when JAX "
            "starts, so run through `python -m bert_jax.commands.pretrain` (which sets it), or export "
            f"XLA_FLAGS='{FLAG}' before starting Python"
        )

