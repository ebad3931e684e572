"""A train step compiled ahead of time for devices this host may not have, and what it costs per device.

`make_plan` lowers the exact step `bert_jax.train.program.build_program` makes from abstract shapes
and compiles it: with the TPU compiler for a TPU slice (`tpu_slices`), XLA's GPU compiler for GPUs (`gpu_cards`),
or the XLA CPU compiler for simulated CPU devices, and reads memory, FLOPs, bytes (hlo_traffic) and collectives
(collectives) off the result. bert_jax/plan/plan_report.py writes a Plan's report, one file per kind of target
(report_tpu, report_gpu, report_cpu); the module docstring of bert_jax/commands/plan.py says what each figure means
and where it comes from.
"""
import dataclasses
import importlib.metadata
import math
import os
import time

import flax.linen as nn
import jax
import numpy as np

from bert_jax.plan import collectives as collective_ops, gpu_cards, hlo_flops, hlo_traffic, links as link_table, memory_fit
from bert_jax.parallel import tpu_slices
from bert_jax.train.config_validation import validate_config
from bert_jax.models import disentangled_attention
from bert_jax.models.attention import building_for, devices_platform
from bert_jax.parallel.mesh import batch_shards, make_mesh, resolve_mesh_shapes
from bert_jax.plan.roofline import Roofline
from bert_jax.run.device_memory import refused_sizes_gib
from bert_jax.train import counters, perf, remat_auto
from bert_jax.train.program import build_program, lower_step
from bert_jax.train.state import example_batch

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
    compiler: str  # e.g. "cpu", "tpu": the XLA backend whose figures these are
    compiler_version: str
    scan_layers: bool
    params: list[ParamRow]

    peak_bytes: int  # per device: arguments + outputs - aliased + temporaries
    bytes_accessed: float = float("nan")  # per device, from cost_analysis
    kernel: str = ""  # the attention kernel the step runs
    remat_policy: str = ""
    tokens_per_step: int = 0  # whole step
    micro_batch_per_chip: int = 0  # sequences in one forward/backward on one chip (or device)
    # Scanned layers on the TPU: compiled FLOPs and bytes count every layer (see the module docstring).
    layers_counted: str = ""
    pallas_flops: float = 0.0  # per device, added from the formula: a Pallas kernel's work the compiler cannot see
    # TPU: the program's bytes by where they live, and its loops (bert_jax/plan/hlo_traffic.py); the roofline divides
    # only HBM bytes.
    traffic: hlo_traffic.Traffic | None = None
    tpu_slice: tpu_slices.TpuSlice | None = None
    gpus: gpu_cards.GpuSet | None = None  # compiled by XLA's GPU compiler for these cards
    libtpu_init_args: str = ""
    every_loop_counted: bool = False  # FLOPs count every loop's trips (make_plan's count_every_layer)
    # The most compiled_flops can be once every loop's trips are counted (they are, or need not be: equal).
    flops_ceiling: float = math.inf
    dots_whole: bool = False  # compiled_flops are from the step compiled with windowed einsums off (WHOLE_DOTS)
    # An accumulating TPU step: the FLOPs of its part after the micro-batch loop (the update, once per step),
    # counted on that part compiled alone (`_step_tail_flops`); 0 without accumulation.
    tail_flops: float = 0.0
    # Every collective of the step, bytes per device and the link each crosses (bert_jax/plan/collectives.py).
    collectives: tuple[collective_ops.Collective, ...] = ()

    @property
    def hbm_bytes(self) -> float:
        return self.traffic.hbm if self.traffic else float("nan")

    @property
    def on_chip_bytes(self) -> float:
        return self.traffic.on_chip if self.traffic else float("nan")

    @property
    def layer_loop_trips(self) -> tuple[int, ...]:
        """A scanned TPU step's layer loops' trip counts."""
        return self.traffic.innermost_trips if self.traffic and self.scan_layers else ()

    @property
    def step_is_exact(self) -> bool:
        """Whether the roofline step time is the step's own, not a lower bound on it: its FLOPs are counted, or
        it is memory-bound even at its FLOPs ceiling (the bytes, counted by trips, are exact either way)."""
        if self.flops_ceiling <= self.compiled_flops or self.roofline is None:
            return True
        return self.roofline.floor_s >= (self.flops_ceiling + self.pallas_flops) / self.roofline.peak_flops

    @property
    def accelerator(self) -> "tpu_slices.TpuSlice | gpu_cards.GpuSet | None":
        """The TPU slice or the GPUs this plan was compiled for by their own compiler; None: simulated CPU devices."""
        return self.tpu_slice or self.gpus

    @property
    def links(self) -> link_table.Links | None:
        """The links between the accelerator's devices, from the data sheets (bert_jax/plan/links.toml)."""
        return link_table.links_for(self.accelerator) if self.accelerator is not None else None

    @property
    def roofline(self) -> Roofline | None:
        if self.accelerator is None:
            return None
        chip = self.accelerator.chip
        return Roofline(flops=self.compiled_flops + self.pallas_flops, bytes=self.hbm_bytes,
                        formula_flops=self.formula_flops / self.num_devices, tokens=self.tokens_per_step / self.num_devices,
                        peak_flops=chip.peak_flops, hbm_bytes_per_s=chip.hbm_bytes_per_s,
                        links=link_table.link_times(self.collectives, self.links))


def _path(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def _bytes_per_device(abstract_tree) -> int:
    return sum(
        math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
        for leaf in jax.tree.leaves(abstract_tree)
    )


class DoesNotFit(Exception):
    """The TPU compiler refused the step: its temporaries alone exceed a chip's HBM (it does not compile a
    program it cannot place, so there is no memory analysis, only its message)."""

    def __init__(self, message: str, needed_gib: float, available_gib: float):
        super().__init__(message)
        self.needed_gib, self.available_gib = needed_gib, available_gib


def _compile(config, mesh, compiler_options: dict | None = None, keep_lowered: list | None = None, program=None):
    """(program, compiled step, seconds to compile) for config's train step on mesh (`program`, config's, when built
    already); the unoptimised HLO text is appended to keep_lowered when given."""
    program = program or build_program(config, mesh)
    start = time.perf_counter()
    lowered = lower_step(program, config, mesh)
    if keep_lowered is not None:
        keep_lowered.append(lowered.as_text(dialect="hlo"))
    try:
        compiled = lowered.compile(compiler_options=compiler_options)
    except jax.errors.JaxRuntimeError as e:
        sizes = refused_sizes_gib(str(e))
        if sizes is None:
            raise
        needed, available = sizes
        raise DoesNotFit(f"does not fit: the TPU compiler needs {needed:.2f} GiB per chip for temporaries "
                         f"alone, of the {available:.2f} GiB it can use ({needed - available:.2f} GiB over; "
                         f"compiled in {time.perf_counter() - start:.0f} s)", needed, available) from None
    return program, compiled, time.perf_counter() - start


def _resolved_and_compiled(config, mesh, limit_bytes: float | None, keep_lowered: list | None = None):
    """(config with remat_policy=auto resolved as the run on those devices resolves it, its program, the compiled
    step, seconds to compile): auto's own compile of a fitting step is the one kept, and its time counted."""
    start, auto = time.perf_counter(), config.model.get("remat_policy", "none") == "auto"
    config, program = remat_auto.build(config, mesh, limit_bytes)
    resolving_s = time.perf_counter() - start if auto else 0.0
    program, compiled, compile_s = _compile(config, mesh, keep_lowered=keep_lowered, program=program)
    return config, program, compiled, compile_s + resolving_s


def _cost(compiled) -> dict:
    cost = compiled.cost_analysis()
    return cost[0] if isinstance(cost, (list, tuple)) else cost


def _step_tail_flops(program, config, mesh) -> float:
    """The compiled FLOPs of the step's part after its gradients (the optimizer's update, the metrics), compiled
    alone: the part an accumulating step runs once, where the compiler's count of the whole step takes the
    micro-batch loop's body, which it runs grad_accum_steps times, once."""
    batch = jax.eval_shape(lambda: example_batch(config.data, config.train.global_batch_size))
    weights = jax.eval_shape(program.objective.weights, batch)  # the loss sums have the weights' structure
    with jax.set_mesh(mesh), nn.logical_axis_rules(program.rules):
        compiled = program.step_tail.lower(program.abstract_state, program.abstract_state.params, weights, weights,
                                           batch).compile()
    return float(_cost(compiled)["flops"])


def per_micro_batch(flops: float, accum: int, tail_flops: float) -> float:
    """A step's FLOPs counted with its micro-batch loop's body once, from the step's own (`accumulated`'s inverse)."""
    return (flops - tail_flops) / accum + tail_flops


def accumulated(flops: float, accum: int, tail_flops: float) -> float:
    """A step's FLOPs from its count with the micro-batch loop's body once (`flops`): the loop's body `accum`
    times, the rest of the step (`tail_flops`) once."""
    return (flops - tail_flops) * accum + tail_flops


def tpu_mesh(config, tpu_slice: "tpu_slices.TpuSlice | gpu_cards.GpuSet"):
    """The run's mesh over the slice's (or the GPUs') devices; a config.mesh that does not divide the chips fails
    naming both."""
    if isinstance(tpu_slice, gpu_cards.GpuSet):
        devices = gpu_cards.gpu_devices(tpu_slice)
    else:
        devices = tpu_slices.slice_devices(tpu_slice)
    try:
        resolve_mesh_shapes(config.mesh, len(devices))
    except ValueError as e:
        raise ValueError(f"config.mesh.shape={tuple(config.mesh.shape)} (dcn_shape="
                         f"{tuple(config.mesh.get('dcn_shape', (1, 1, 1)))}) does not fit the {len(devices)} chips of "
                         f"{tpu_slice.label}: {e}") from None
    return make_mesh(config.mesh, devices)


def partition_domains(mesh) -> list[int]:
    """The slice (TPU) or node (GPU) each partition of a program compiled over `mesh` runs on: partition p runs on
    the mesh's p-th device (jit's device assignment is the mesh's devices in order)."""
    return [getattr(d, "slice_index", None) or 0 if getattr(d, "platform", "") == "tpu" else d.process_index
            for d in mesh.devices.flat]


def _pallas_flops(config, model_config, kernel: str, num_devices: int) -> float:
    """FLOPs per device of a Pallas attention kernel (splash, DeBERTa's fused disentangled kernel), which
    cost_analysis does not see: the formula's attention term (perf.module_attention_flops, with DeBERTa's
    position terms) for every network of the module (perf.networks: a generator's layers too, at its own width).
    Model FLOPs, not what the tiles execute: neither kernel's backward recomputation is counted, as remat's
    would be in XLA's count, nor the fused kernel's position products against two blocks' width of relative
    rows per tile (about 1.9x the term at S=512 in all, kernels/disentangled_attention.py). Their bytes need no
    formula: a kernel's custom calls read and write their operands and results, which hlo_traffic counts."""
    if kernel not in PALLAS_FLOPS_SOURCE or model_config is None:
        return 0.0
    b, s = config.train.global_batch_size, config.data.max_seq_length
    return perf.module_attention_flops(model_config, s, b) / num_devices


PALLAS_FLOPS_SOURCE = {
    "splash": "the formula's attention term, 12*layers*hidden*S^2*B, for each network that runs it",
    "cudnn": "the formula's attention term, 12*layers*hidden*S^2*B, for each network that runs it",
    "triton": "the formula's attention term, 12*layers*hidden*S^2*B, for each network that runs it (a windowed "
              "layer's tiles execute about (128 + 2*window)/S of it, kernels/windowed_attention.py)",
    disentangled_attention.FUSED_KERNEL: "the formula's attention term with the position terms, "
                                         "12*layers*hidden*S*(S + 2*position_buckets)*B, generator layers included "
                                         "(model FLOPs: its tiles execute about 1.9x that at S=512)",
}


def _layers_in_loop(unroll: int, length: int) -> int:
    """Layers the compiler's count sees of a scan over `length` layers with `unroll` per iteration: the
    loop's body once, plus the remainder jax.lax.scan unrolls after the loop."""
    return min(length, unroll + length % unroll)


# Windowed einsums (collective matmuls: FSDP and tensor sharding bring them) run a dot in pieces, in loops the
# compiler makes, whose bodies cost_analysis counts once. FLOPs come from compiles with them off: the same dots,
# whole. The program that runs, its memory and its bytes, keeps them.
WHOLE_DOTS = {"xla_tpu_enable_windowed_einsum_for_all_gather": False,
              "xla_tpu_enable_windowed_einsum_for_reduce_scatter": False}


def _every_loop_flops(config, mesh, flops: float, traffic: hlo_traffic.Traffic, per_layer: tuple | None = None,
                      per_layer_from: str = "measured on a step like this one",
                      dots_whole: bool = False) -> tuple[float, str, float, tuple | None]:
    """(FLOPs per micro-batch with every loop's trips counted, how, seconds, one layer's FLOPs for each length
    of layer loop, shortest first) of a TPU step whose compiled count is `flops`.

    The TPU compiler counts a loop's body once. Its own loops are compiled away (WHOLE_DOTS). Of scanned
    layers, with u layers per iteration it counts out + sum_g k_g(u) * b_g over the layer loops of each length
    T_g (k_g(u) the layers it sees, _layers_in_loop; b_g one layer's forward, backward and remat). Compiles at
    as many more unrolls as there are lengths solve for out and each b_g (12 and 24 layers look alike at
    u = 2 and 3, not at 5), and every layer counts out + sum_g T_g * b_g. The lengths are the trips of the
    scan_unroll=1 program (hlo_traffic). Bytes need none of this: hlo_traffic counts each loop's trips. A
    caller that knows one layer's FLOPs per length (`per_layer`: a search, from a step like this one) skips
    the compiles at other unrolls; `dots_whole`: `flops` are already from the step with windowed einsums off.
    """
    options = WHOLE_DOTS if traffic.compiler_loops else None
    seconds, notes = 0.0, []
    if options:
        if not dots_whole:
            _, compiled, seconds = _compile(config, mesh, options)
            flops = float(_cost(compiled)["flops"])
        notes.append(f"FLOPs from the step compiled with windowed einsums off: the compiler's {traffic.compiler_loops} "
                     "loops around pieces of a dot count their body once")
    if not (config.model.scan_layers and traffic.innermost_trips):
        return flops, "; ".join(notes), seconds, per_layer
    samples = {config.model.get("scan_unroll", 1): flops}  # scan_unroll -> the compiler's FLOPs

    def compile_at(unroll: int):
        nonlocal seconds
        other = config.copy_and_resolve_references()
        other.model.scan_unroll = unroll
        _, compiled, more = _compile(other, mesh, options)
        seconds += more
        samples[unroll] = float(_cost(compiled)["flops"])
        return compiled

    trips = traffic.innermost_trips if 1 in samples else hlo_traffic.traffic(compile_at(1).as_text()).innermost_trips
    lengths = sorted(set(trips))
    if max(lengths) <= 1:  # nothing the count missed
        return flops, "; ".join(notes), seconds, per_layer
    if per_layer is not None and len(per_layer) == len(lengths):
        per_layers, source = list(per_layer), per_layer_from
    else:
        row = lambda u: [1.0] + [float(_layers_in_loop(u, t)) for t in lengths]  # noqa: E731
        for unroll in range(2, max(lengths) + 1):  # compile only the unrolls that tell the loops apart
            rows = [row(u) for u in samples]
            if len(rows) == len(lengths) + 1:
                break
            if unroll not in samples and np.linalg.matrix_rank(np.array(rows + [row(unroll)])) > len(rows):
                compile_at(unroll)
        if len(samples) < len(lengths) + 1:
            notes.insert(0, f"scanned layers: layer loops of {lengths} trips, too short to tell apart: FLOPs count "
                            "each loop's body once")
            return flops, "; ".join(notes), seconds, None
        per_layers = list(np.linalg.solve(np.array([row(u) for u in samples]), np.array(list(samples.values())))[1:])
        source = "solved from the step and compiles with " + ", ".join(
            f"scan_unroll={u}" for u in samples if u != config.model.get("scan_unroll", 1))
    total = samples[1] + sum((t - 1) * b for t, b in zip(lengths, per_layers))  # scan_unroll=1 counts one layer per loop
    kind = "every layer counted" if len(lengths) == 1 else "every layer of loops of several lengths counted"
    per = ", ".join(f"{t} layers at {b:.4g}" for t, b in zip(lengths, per_layers))
    notes.insert(0, f"scanned layers: FLOPs with {kind} ({per}, {source}); bytes count each loop's trips (hlo_traffic)")
    return float(total), "; ".join(notes), seconds, tuple(float(b) for b in per_layers)


def _every_loop_flops_or_by_sequence(config, mesh, flops: float, traffic: hlo_traffic.Traffic,
                                     per_layer: tuple | None = None,
                                     dots_whole: bool = False) -> tuple[float, str, float, tuple | None]:
    """_every_loop_flops; where its more unrolled compiles are refused for memory, one layer's FLOPs are counted
    on the same step at one sequence per chip and scaled by the micro-batch: a layer's work is linear in its
    sequences (ModernBERT-large at 8192 with dots remat fits 12 sequences per v5p chip; unrolled twice it does not)."""
    try:
        return _every_loop_flops(config, mesh, flops, traffic, per_layer, dots_whole=dots_whole)
    except DoesNotFit as refused:
        micro = config.train.global_batch_size // config.train.grad_accum_steps // batch_shards(mesh.shape)
        if per_layer is not None or micro == 1:
            raise
        one = config.copy_and_resolve_references()
        one.train.grad_accum_steps *= micro
        _, compiled, seconds = _compile(one, mesh)
        _, _, more, per_sequence = _every_loop_flops(one, mesh, float(_cost(compiled)["flops"]),
                                                     hlo_traffic.traffic(compiled.as_text()))
        if per_sequence is None:
            raise refused from None
        flops, how, rest, per_layer = _every_loop_flops(
            config, mesh, flops, traffic, tuple(b * micro for b in per_sequence),
            f"counted at one sequence per chip, times {micro}: the count at {micro} was refused for memory "
            f"({refused.needed_gib:.1f} GiB)", dots_whole)
        return flops, how, seconds + more + rest, per_layer


def _flops_ceiling(flops: float, traffic: hlo_traffic.Traffic, accum: int, dots_whole: bool = False) -> float:
    """The most FLOPs per step that counting every loop's trips can give a step whose compiled count, `flops`
    per micro-batch, takes each loop's body once: no instruction of a micro-batch runs more often than the longest
    layer loop's trips times the longest compiler-made loop's (layer loops hold no layer loop), and the plan
    counts the micro-batch `accum` times (`dots_whole`: counted with those compiler loops compiled away). Loose (all
    that is outside the layers counted as often), but a step memory-bound even at it has its step time without
    the count."""
    if traffic.loops_counted_once:
        return math.inf
    windows = 1 if dots_whole else max(traffic.compiler_loop_trips, default=1)
    return flops * accum * max(traffic.innermost_trips, default=1) * windows


def _counted_by_trips(traffic: hlo_traffic.Traffic | None, config) -> bool:
    """Whether a TPU step has loops the compiler's count takes once (its own, or scanned layers): its FLOPs
    then need _every_loop_flops, and its bytes are hlo_traffic's."""
    return bool(traffic and (traffic.compiler_loops or (config.model.scan_layers and traffic.innermost_trips)))


def count_every_layer(plan: "Plan", config, per_layer: tuple | None = None) -> tuple["Plan", tuple | None]:
    """A plan made with count_every_layer=False, its FLOPs now counting every loop's trips (one or more
    compiles), and one scanned layer's FLOPs per loop length (pass them back for a step like this one to skip
    the compiles at other unrolls)."""
    if not counting_needed(plan, config):
        return plan, per_layer
    mesh = tpu_mesh(config, plan.tpu_slice)
    accum, tail = config.train.grad_accum_steps, plan.tail_flops
    flops, how, seconds, per_layer = _every_loop_flops_or_by_sequence(
        config, mesh, per_micro_batch(plan.compiled_flops, accum, tail), plan.traffic, per_layer, plan.dots_whole)
    flops = accumulated(flops, accum, tail)
    return dataclasses.replace(plan, compiled_flops=flops, compile_s=plan.compile_s + seconds,
                               every_loop_counted=True, flops_ceiling=flops,
                               layers_counted="; ".join(filter(None, [how, plan.layers_counted]))), per_layer


def with_whole_dots(plan: "Plan", config) -> "Plan":
    """A plan made with count_every_layer=False, its FLOPs now from the step compiled with windowed einsums off
    (one compile, not unrolled; count_every_layer then skips it). They still take a layer loop's body once, but
    their ceiling no longer multiplies by the windowed loops' trips (16 under FSDP on v5p-32), so a memory-bound
    FSDP step can be settled without the unrolled compiles."""
    if plan.dots_whole or not plan.traffic or not plan.traffic.compiler_loops:
        return plan
    _, compiled, seconds = _compile(config, tpu_mesh(config, plan.tpu_slice), WHOLE_DOTS)
    flops, accum = float(_cost(compiled)["flops"]), config.train.grad_accum_steps
    counted = not (config.model.scan_layers and plan.traffic.innermost_trips)  # no layer loops: nothing else to count
    total = accumulated(flops, accum, plan.tail_flops)
    return dataclasses.replace(plan, compiled_flops=total, compile_s=plan.compile_s + seconds, dots_whole=True,
                               every_loop_counted=counted,
                               flops_ceiling=total if counted else _flops_ceiling(flops, plan.traffic, accum, True))


def counting_needed(plan: "Plan", config) -> bool:
    """Whether plan's FLOPs count some loop's body once (count_every_layer would compile again); its bytes,
    read by trips, are exact either way, so its roofline step time is a lower bound on the counted one's."""
    return not plan.every_loop_counted and _counted_by_trips(plan.traffic, config)


def make_plan(config, tpu_slice: tpu_slices.TpuSlice | None = None, count_every_layer: bool = True) -> Plan:
    """Compiles config's train step: for `tpu_slice` with the TPU compiler, else for the CPU devices JAX has now
    (set their number before JAX starts, `use_simulated_devices`). count_every_layer=False skips the second
    compile that counts a scanned TPU step's every layer (memory alone: what a search screens with). A GPU set
    (bert_jax/plan/gpu_cards.py) for `tpu_slice`: XLA's GPU compiler, for those cards (`_make_gpu_plan`)."""
    if isinstance(tpu_slice, gpu_cards.GpuSet):
        return _make_gpu_plan(config, tpu_slice)
    if tpu_slice is not None:
        tpu_slices.set_libtpu_init_args(config)  # the flags the run on the TPU sets
        with building_for("tpu"):
            validate_config(config, 1)
        mesh = tpu_mesh(config, tpu_slice)
        limit = tpu_slice.chip.hbm_gib * GIB
    else:
        validate_config(config, 1)
        mesh, limit = make_mesh(config.mesh), None
    config, program, compiled, compile_s = _resolved_and_compiled(config, mesh, limit)
    memory = compiled.memory_analysis()
    cost = _cost(compiled)
    flops, bytes_accessed = float(cost.get("flops", float("nan"))), float(cost.get("bytes accessed", float("nan")))
    layers_counted = ""
    text = compiled.as_text()
    traffic = hlo_traffic.traffic(text) if tpu_slice is not None else None
    found = collective_ops.collectives(text, partition_domains(mesh), tpu_slice.num_slices if tpu_slice else 1)
    counted = False
    accum = config.train.grad_accum_steps
    ceiling = None  # the FLOPs are exact
    if _counted_by_trips(traffic, config):
        bytes_accessed = traffic.total  # the compiler's own figure counts each loop's body once
        ceiling = _flops_ceiling(flops, traffic, accum)
        if count_every_layer:
            try:
                flops, layers_counted, seconds, _ = _every_loop_flops_or_by_sequence(config, mesh, flops, traffic)
                compile_s, counted, ceiling = compile_s + seconds, True, None
            except DoesNotFit as e:  # the step fits; a variant compiled only to count FLOPs (more unrolled) did not
                layers_counted = (f"FLOPs count each loop's body once (too low): the compile that counts every layer "
                                  f"was refused for memory ({e})")
    if traffic is not None and traffic.loops_counted_once:
        layers_counted = "; ".join(filter(None, [layers_counted, (
            f"{traffic.loops_counted_once} loop(s) whose trip count hlo_traffic could not read: their body counted "
            "once, so FLOPs and bytes are too low")]))
    tail = 0.0
    if tpu_slice is not None and accum > 1:
        # Micro-batches run in a loop the compiler also counts once: its body counted accum times, and the rest of
        # the step (the update), compiled alone, once. hlo_traffic counts the loop's trips when it can read them;
        # where it cannot, bytes are counted as FLOPs were before (the update's accum times: an upper bound).
        tail = _step_tail_flops(program, config, mesh)
        flops = accumulated(flops, accum, tail)
        if not _counted_by_trips(traffic, config):  # bytes_accessed is the compiler's count
            bytes_accessed *= accum
        if traffic.loops_counted_once:
            traffic = dataclasses.replace(traffic, hbm=traffic.hbm * accum, on_chip=traffic.on_chip * accum)
        bytes_note = ("bytes counted the same way with the update's accum times (an upper bound)"
                      if traffic.loops_counted_once else "bytes count the loop's trips")
        layers_counted = "; ".join(filter(None, [layers_counted, (
            f"grad_accum_steps={accum}: the micro-batch loop's FLOPs counted {accum} times, the update's "
            f"({tail:.4g}, compiled alone) once; {bytes_note}")]))
    kernel = program.attention_kernel
    pallas_flops = _pallas_flops(config, getattr(program.model, "config", None), kernel, mesh.size) if tpu_slice is not None else 0.0
    plan = _plan_from(config, program, mesh, memory, flops, compile_s, layers_counted)
    return dataclasses.replace(
        plan, compiler_version=_compiler_version(tpu_slice), bytes_accessed=bytes_accessed, pallas_flops=pallas_flops,
        tpu_slice=tpu_slice, traffic=traffic, every_loop_counted=counted, collectives=tuple(found),
        libtpu_init_args=os.environ.get("LIBTPU_INIT_ARGS", "") if tpu_slice is not None else "",
        flops_ceiling=flops if ceiling is None else ceiling, tail_flops=tail,
    )

def _make_gpu_plan(config, gpus: gpu_cards.GpuSet) -> Plan:
    """config's train step compiled by XLA's GPU compiler for `gpus`: memory from memory_analysis(); HBM bytes
    and kernel launches from the optimised HLO, every loop's trips counted (hlo_traffic); FLOPs from the dots of the
    unoptimised HLO (hlo_flops: cost_analysis() is None for these devices), plus a fused attention kernel's
    from the formula."""
    # The whole plan, formula FLOPs included, sees the target's devices, and kernel choices and jax's cuDNN checks
    # follow the card's compute capability (its description, gpu_targets/).
    with building_for("gpu", gpus.chip.compute_capability), gpu_cards.cudnn_checks_answered_for(gpus.chip):
        validate_config(config, 1)
        mesh = tpu_mesh(config, gpus)
        unoptimised: list[str] = []
        config, program, compiled, compile_s = _resolved_and_compiled(
            config, mesh, gpus.chip.device_memory_bytes * memory_fit.gpu_memory_fraction(), keep_lowered=unoptimised)
        memory = compiled.memory_analysis()
        flops, loops_once = hlo_flops.dot_flops(unoptimised[0])
        text = compiled.as_text()
        traffic = hlo_traffic.traffic(text)
        found = collective_ops.collectives(text, partition_domains(mesh))
        notes = [f"{n} loop(s) whose trip count could not be read: their body counted once, so FLOPs and bytes are too "
                 "low" for n in {traffic.loops_counted_once, loops_once} if n]
        plan = _plan_from(config, program, mesh, memory, flops / mesh.size, compile_s, "; ".join(notes))
        kernel_flops = _pallas_flops(config, getattr(program.model, "config", None), program.attention_kernel, mesh.size)
        return dataclasses.replace(plan, traffic=traffic, bytes_accessed=traffic.total, gpus=gpus, collectives=tuple(found),
                                   pallas_flops=kernel_flops, every_loop_counted=True,
                                   compiler_version=f"jax {jax.__version__}, jax-cuda12-plugin "
                                                    f"{importlib.metadata.version('jax-cuda12-plugin')}")


def _plan_from(config, program, mesh, memory, flops: float, compile_s: float, layers_counted: str) -> Plan:
    """A Plan of a compiled step whose FLOPs per device are `flops` (every loop counted)."""
    state, m = program.abstract_state, config.model
    rows = [
        ParamRow(_path(path), tuple(leaf.shape), str(tuple(leaf.sharding.spec)),
                 tuple(leaf.sharding.shard_shape(leaf.shape)), str(leaf.dtype))
        for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]
    ]
    accum = config.train.grad_accum_steps
    return Plan(
        mesh_shape=dict(mesh.shape), num_devices=mesh.size, param_count=perf.count_params(state.params),
        param_bytes=_bytes_per_device(state.params), opt_state_bytes=_bytes_per_device(state.opt_state),
        frozen_bytes=_bytes_per_device(program.abstract_frozen),
        argument_bytes=memory.argument_size_in_bytes, output_bytes=memory.output_size_in_bytes,
        alias_bytes=memory.alias_size_in_bytes, temp_bytes=memory.temp_size_in_bytes,
        compiled_flops=flops, formula_flops=perf.step_flops(program, config),
        peak_bytes=memory_fit.compiled_peak_bytes(memory), compile_s=compile_s,
        compiler=devices_platform(mesh.devices.flat), compiler_version=f"jax {jax.__version__}",
        scan_layers=bool(m.scan_layers), params=rows, kernel=program.attention_kernel, remat_policy=m.remat_policy,
        tokens_per_step=counters.tokens_per_step(config),
        micro_batch_per_chip=config.train.global_batch_size // accum // batch_shards(mesh.shape),
        layers_counted=layers_counted, flops_ceiling=flops,
    )


def _compiler_version(tpu_slice) -> str:
    if tpu_slice is None:
        return f"jax {jax.__version__}"
    return f"jax {jax.__version__}, libtpu {importlib.metadata.version('libtpu')}"


def fits(plan: Plan, hbm_gib: float = 0.0) -> tuple[bool, float]:
    """(whether a TPU or GPU plan's peak fits one chip's HBM, or hbm_gib when given; the chip's usable bytes). A
    GPU program may use XLA_PYTHON_CLIENT_MEM_FRACTION of what the card reports (JAX's pool, 75 % by default)."""
    if plan.gpus is not None:
        usable = (hbm_gib * GIB or plan.gpus.chip.device_memory_bytes) * memory_fit.gpu_memory_fraction()
        return plan.peak_bytes <= usable, usable
    usable = (hbm_gib or plan.tpu_slice.chip.hbm_gib) * GIB
    return plan.peak_bytes <= usable, usable


def compiler_name(accelerator) -> str:
    """Which compiler plans for a TPU slice or GPU set, in words."""
    return "XLA's GPU compiler" if isinstance(accelerator, gpu_cards.GpuSet) else "the TPU compiler"


def use_simulated_devices(num_devices: int) -> None:
    """Gives JAX `num_devices` CPU devices; must run before JAX initialises its backend."""
    # An XLA_FLAGS device count would contradict jax_num_cpu_devices: this flag decides.
    xla_flags = os.environ.get("XLA_FLAGS", "").split()
    os.environ["XLA_FLAGS"] = " ".join(f for f in xla_flags if "xla_force_host_platform_device_count" not in f)
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", num_devices)
