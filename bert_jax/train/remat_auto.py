"""config.model.remat_policy='auto': no rematerialisation where the compiled step fits the device, else full.

Why: what a step holds depends on the tokens per device, the family, the kernel and the mesh (a 32,768-token row over
a context axis of 4 holds as many tokens per chip as 4 rows of 8,192), and no formula here tracks all of them; the
compiler does. So `auto` compiles the step without remat first (TPU: the compiler refuses a program that cannot fit;
GPU: its memory analysis against the allocator's limit) and falls back to `full`, which holds one layer's
activations at a time. A fitting `none` program is the one returned, compiled: the step's own compile of it is
jit's cached one. A `full` run pays one compile more. Where no limit is known (the CPU), `none`, nothing compiled.

The run (train/loop.py, train/budget_calibration.py: `build_here`) takes its devices' allocator limit; the planner
passes the target's HBM, so that `bert-jax plan` says what the run will choose.
"""
import jax
from absl import logging

from bert_jax.run.device_memory import GIB, bytes_limit, compiled_peak_bytes, refused_sizes_gib
from bert_jax.train.program import TrainProgram, build_program, lower_step

FALLBACK = "full"
_MEASURED: dict[tuple, tuple[int, bool]] = {}  # peak_without_remat's answers, by (config, mesh)


def build(config, mesh, limit_bytes: int | float | None) -> tuple[object, TrainProgram]:
    """(config with remat_policy=auto resolved, its program) for `mesh`'s devices holding at most `limit_bytes` each
    (None: no limit known); any other policy is built as it is. Logs what auto chose and why."""
    if config.model.get("remat_policy", "none") != "auto":
        return config, build_program(config, mesh)
    plain = _with_policy(config, "none")
    if limit_bytes is None:
        return _chose(plain, "no device memory limit is known here"), build_program(plain, mesh)
    program = build_program(plain, mesh)
    needed, refused = peak_without_remat(plain, mesh, program)
    why = (f"the step without remat needs {'more than ' if refused else ''}{needed / GIB:.2f} GiB of "
           f"{limit_bytes / GIB:.2f} GiB per device")
    if not refused and needed <= limit_bytes:
        return _chose(plain, why), program
    full = _chose(_with_policy(config, FALLBACK), why)
    return full, build_program(full, mesh)


def build_here(config, mesh) -> tuple[object, TrainProgram]:
    """`build` for a run: the limit is the smallest of this process's devices' allocators (none known on a CPU)."""
    return build(config, mesh, bytes_limit(mesh.local_devices))


def peak_without_remat(config, mesh, program: TrainProgram | None = None) -> tuple[int, bool]:
    """(config's step compiled with remat_policy=none: its peak bytes per device, False), or (its temporaries alone,
    True) when the compiler refused it for memory. Compiled once per config and mesh: the planner resolves one config
    several times (its stages, fixes, FLOP counts). `program`: config's, built already."""
    config = _with_policy(config, "none")
    key = (config.to_json_best_effort(sort_keys=True), repr(mesh))
    if key not in _MEASURED:
        _MEASURED[key] = _peak_bytes(program or build_program(config, mesh), config, mesh)
    return _MEASURED[key]


def _peak_bytes(program, config, mesh) -> tuple[int, bool]:
    try:
        compiled = lower_step(program, config, mesh).compile()
    except jax.errors.JaxRuntimeError as e:
        sizes = refused_sizes_gib(str(e))
        if sizes is None:
            raise
        return int(sizes[0] * GIB), True
    memory = compiled.memory_analysis()
    return (0 if memory is None else compiled_peak_bytes(memory)), False


def _with_policy(config, policy: str):
    resolved = config.copy_and_resolve_references()
    with resolved.unlocked():
        resolved.model.remat_policy = policy
    return resolved


def _chose(config, why: str):
    logging.info("config.model.remat_policy=auto -> %s (%s)", config.model.remat_policy, why)
    return config
