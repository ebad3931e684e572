"""Plans a run for hardware you do not have: compiles the train step ahead of time for N devices.

    python -m bert_jax.plan --config=configs/bert_large.py --num_devices=1 --target=h100
    python -m bert_jax.plan --config=configs/bert_large.py --num_devices=16 \
        --config.mesh.shape='(1,-1,1)' --target=tpu_v4

JAX is given N simulated CPU devices before it starts; the train step that
`bert_jax.train.program.build_program` makes (the one that trains) is lowered from
abstract shapes (no parameter is ever allocated) and compiled by the XLA CPU compiler.
Printed per device: parameter and optimizer-state bytes (from each leaf's sharding),
the compiler's temporaries (`compiled.memory_analysis()`), FLOPs per step
(`cost_analysis()`) next to the formula in bert_jax/train/perf.py, the sharding of
every parameter, and with --target (or --hbm_gib) whether it fits.

Parameter and optimizer bytes are exact. Temporaries are the CPU compiler's schedule:
an accelerator's compiler fuses and schedules differently, and its peak was measured
at 0.64x to more than 1.29x this figure (bert_jax/memory_fit.py). The fit is judged
over that whole band: "fits with margin", "uncertain" or "does not fit".
"""
import dataclasses
import math
import os
import time

import flax.linen as nn
import jax
from absl import app, flags
from ml_collections import config_flags

from bert_jax import memory_fit
from bert_jax.config_validation import validate_config
from bert_jax.parallel.mesh import make_mesh
from bert_jax.train import perf
from bert_jax.train.program import build_program
from bert_jax.train.state import example_batch

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file.", lock_config=True)
_NUM_DEVICES = flags.DEFINE_integer("num_devices", 8, "Simulated devices to compile for (e.g. 16 for a v4-32).")
_TARGET = flags.DEFINE_enum("target", "", ["", *memory_fit.TARGETS], "Device kind to judge the fit on.")
_HBM_GIB = flags.DEFINE_float("hbm_gib", 0.0, "Memory of one device in GiB; 0 = the target's (or no verdict).")
_MAX_ROWS = flags.DEFINE_integer("max_param_rows", 0, "Print at most this many parameter rows; 0 = all.")
flags.mark_flags_as_required(["config"])

GIB = 1024**3


@dataclasses.dataclass
class ParamRow:
    path: str
    global_shape: tuple[int, ...]
    spec: str
    shard_shape: tuple[int, ...]
    dtype: str


@dataclasses.dataclass
class Plan:
    mesh_shape: dict[str, int]
    num_devices: int
    param_count: int
    param_bytes: int  # per device
    opt_state_bytes: int  # per device
    frozen_bytes: int  # per device: a distillation teacher's params (no gradient, no optimizer state)
    argument_bytes: int  # per device: state + batch, as the compiler counts them
    output_bytes: int
    alias_bytes: int  # outputs that reuse donated inputs
    temp_bytes: int  # per device: activations, gradients, collectives' buffers
    compiled_flops: float  # per device, from cost_analysis (includes remat recomputation)
    formula_flops: float  # whole step, from bert_jax/train/perf.py
    compile_s: float
    compiler: str  # e.g. "cpu": the XLA backend whose figures these are
    compiler_version: str
    scan_layers: bool
    params: list[ParamRow]

    peak_bytes: int  # per device: arguments + outputs - aliased + temporaries


def _path(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _bytes_per_device(abstract_tree) -> int:
    return sum(
        math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
        for leaf in jax.tree.leaves(abstract_tree)
    )


def make_plan(config) -> Plan:
    """Compiles config's train step for the devices JAX has now (set their number before JAX starts)."""
    validate_config(config, 1)
    mesh = make_mesh(config.mesh)
    program = build_program(config, mesh)
    state = program.abstract_state
    batch = jax.eval_shape(lambda: example_batch(config.data, config.train.global_batch_size))
    batch = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=program.data_sharding), batch
    )
    start = time.perf_counter()
    with jax.set_mesh(mesh), nn.logical_axis_rules(program.rules):
        compiled = program.train_step.lower(state, batch, program.abstract_frozen).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost

    rows = [
        ParamRow(_path(path), tuple(leaf.shape), str(tuple(leaf.sharding.spec)),
                 tuple(leaf.sharding.shard_shape(leaf.shape)), str(leaf.dtype))
        for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]
    ]
    return Plan(
        mesh_shape=dict(mesh.shape), num_devices=mesh.size,
        param_count=perf.count_params(state.params),
        param_bytes=_bytes_per_device(state.params), opt_state_bytes=_bytes_per_device(state.opt_state),
        frozen_bytes=_bytes_per_device(program.abstract_frozen),
        argument_bytes=memory.argument_size_in_bytes, output_bytes=memory.output_size_in_bytes,
        alias_bytes=memory.alias_size_in_bytes, temp_bytes=memory.temp_size_in_bytes,
        compiled_flops=float(cost.get("flops", float("nan"))),
        formula_flops=perf.step_flops(program, config),
        peak_bytes=memory_fit.compiled_peak_bytes(memory), compile_s=compile_s,
        compiler=mesh.devices.flat[0].platform, compiler_version=f"jax {jax.__version__}",
        scan_layers=bool(config.model.scan_layers), params=rows,
    )


def format_plan(plan: Plan, target: str = "", hbm_gib: float = 0.0, max_rows: int = 0) -> str:
    """The Markdown report `bert_jax.plan` prints; a fit verdict when a target or hbm_gib is given."""
    gib = lambda b: f"{b / GIB:.3f}"  # noqa: E731
    mesh = ", ".join(f"{k}={v}" for k, v in plan.mesh_shape.items())
    lines = [
        f"mesh ({mesh}) = {plan.num_devices} devices; {plan.param_count:,} parameters; "
        f"compiled in {plan.compile_s:.1f} s",
        "",
        f"Memory and FLOPs below come from the XLA {plan.compiler.upper()} compiler ({plan.compiler_version}) "
        f"compiling for {plan.num_devices} simulated {plan.compiler.upper()} device(s): parameter and optimizer "
        "bytes are exact, temporaries are this compiler's schedule and differ on accelerators.",
        "",
        "| per device | GiB |",
        "|---|---|",
        f"| parameters | {gib(plan.param_bytes)} |",
        f"| optimizer state | {gib(plan.opt_state_bytes)} |",
        *([f"| frozen teacher parameters | {gib(plan.frozen_bytes)} |"] if plan.frozen_bytes else []),
        f"| temporaries (activations, gradients) | {gib(plan.temp_bytes)} |",
        f"| arguments / outputs / aliased (donated) | {gib(plan.argument_bytes)} / {gib(plan.output_bytes)} / "
        f"{gib(plan.alias_bytes)} |",
        f"| **peak** (arguments + outputs - aliased + temporaries) | **{gib(plan.peak_bytes)}** |",
        "",
        f"FLOPs per step: compiled {plan.compiled_flops:.4g} per device x {plan.num_devices} = "
        f"{plan.compiled_flops * plan.num_devices:.4g}; formula {plan.formula_flops:.4g} "
        "(6*N*B*S + 12*layers*hidden*S^2*B + 6*hidden*vocab*B*P, plus a teacher's forward, a third of that "
        "with its sizes, bert_jax/train/perf.py; "
        "the compiled count adds rematerialisation, optimizer and softmax/norm work"
        + ("; with scan_layers XLA counts the scanned layer once, not once per layer)" if plan.scan_layers else ")"),
    ]
    kind, usable_gib = memory_fit.resolve_target(target, hbm_gib)
    if usable_gib > 0:
        fit = memory_fit.judge(plan.peak_bytes, usable_gib, kind, planned_on=plan.compiler)
        device = kind.name if kind else "an unknown device kind"
        if kind and kind.compiler == "gpu":
            device += (f" ({hbm_gib or kind.hbm_gib:g} GiB, of which JAX lets a program use "
                       f"{memory_fit.gpu_memory_fraction():.0%}, XLA_PYTHON_CLIENT_MEM_FRACTION)")
        lines.append(f"\n**{fit.verdict}** on {device}: {fit.explanation}")
    rows = plan.params if max_rows <= 0 else plan.params[:max_rows]
    lines += ["", "| parameter | global shape | partition spec | per-device shape | dtype |", "|---|---|---|---|---|"]
    lines += [f"| {r.path} | {r.global_shape} | {r.spec} | {r.shard_shape} | {r.dtype} |" for r in rows]
    if len(rows) < len(plan.params):
        lines.append(f"| ... {len(plan.params) - len(rows)} more (--max_param_rows=0 for all) | | | | |")
    return "\n".join(lines)


def use_simulated_devices(num_devices: int) -> None:
    """Gives JAX `num_devices` CPU devices; must run before JAX initialises its backend."""
    # An XLA_FLAGS device count would contradict jax_num_cpu_devices: this flag decides.
    xla_flags = os.environ.get("XLA_FLAGS", "").split()
    os.environ["XLA_FLAGS"] = " ".join(f for f in xla_flags if "xla_force_host_platform_device_count" not in f)
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", num_devices)


def _main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    use_simulated_devices(_NUM_DEVICES.value)
    print(format_plan(make_plan(_CONFIG.value), _TARGET.value, _HBM_GIB.value, _MAX_ROWS.value))


def main() -> None:
    app.run(_main)


if __name__ == "__main__":
    main()
