"""Whether a planned step fits a device, said with the error bars the planner really has.

The planner compiles with the XLA CPU compiler, the only one it can run anywhere. Its
parameter and optimizer bytes are exact; its temporaries are the CPU compiler's
schedule, and accelerators schedule differently. How differently was measured: the
peak of the same steps on a real device divided by this planner's peak for them.

On one H100 (docs/results/gpu.md, the code of 2026-11-22, bf16 compute, fp32 params, AdamW, remat
none), `peak_bytes_in_use` against this planner's figure for the same config:

  BERT-base  (seq 128, batch 256)   26.9 GiB on the GPU / 42.3 GiB planned = 0.64
  BERT-large (seq 512, batch 32)    54.3 GiB            / 79.6 GiB         = 0.68
  BERT-large (seq 128, batch 256)   > 146 GiB (out of memory: it asked for 66 GiB
                                    beyond the 80 GiB card) / 112.8 GiB    > 1.29

So the GPU needed from 0.64x to more than 1.29x what the CPU compiler planned: less
where XLA GPU fuses what the CPU keeps, more where it schedules many layers' buffers
at once. A verdict uses the whole band and never says a bare "fits".
"""
import dataclasses
import os

from bert_jax.run.device_memory import compiled_peak_bytes  # noqa: F401  (the planner's peak is the harness's)

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Margin:
    """Real-device peak / this planner's peak, lowest and highest seen, and where that was measured."""

    low: float
    high: float
    source: str


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    hbm_gib: float  # per device, as the vendor sells it
    compiler: str  # "gpu" | "tpu": which XLA backend compiles for it


GPU_MARGIN = Margin(0.64, 1.29, "on one H100 with 3 BERT shapes, 2026-11-22; 1.29x is a lower bound, from a run "
                               "that ran out of memory")
# Accelerator compilers measured against the planner. A kind without its own figures
# gets the widest band measured on any, and the report says so.
MEASURED_MARGINS = {"gpu": GPU_MARGIN}
WIDEST_MARGIN = Margin(min(m.low for m in MEASURED_MARGINS.values()), max(m.high for m in MEASURED_MARGINS.values()),
                       "the widest measured on any accelerator: " + "; ".join(
                           m.source for m in MEASURED_MARGINS.values()))
TARGETS = {
    "h100": Target("NVIDIA H100 80GB", 80, "gpu"),
    "h200": Target("NVIDIA H200", 141, "gpu"),
    "a100_40gb": Target("NVIDIA A100 40GB", 40, "gpu"),
    "a100_80gb": Target("NVIDIA A100 80GB", 80, "gpu"),
    "tpu_v4": Target("TPU v4", 32, "tpu"),
    "tpu_v5e": Target("TPU v5e", 16, "tpu"),
    "tpu_v5p": Target("TPU v5p", 95, "tpu"),
    "tpu_v6e": Target("TPU v6e", 32, "tpu"),
}
VERDICTS = ("fits with margin", "uncertain", "does not fit")


@dataclasses.dataclass(frozen=True)
class Fit:
    verdict: str  # one of VERDICTS
    low_bytes: float  # the device's peak, as low and as high as the margin allows
    high_bytes: float
    usable_bytes: float
    margin: Margin
    explanation: str


def gpu_memory_fraction() -> float:
    """The share of a GPU's memory JAX lets a program use: XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 by default."""
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))


def resolve_target(target: str, hbm_gib: float) -> tuple[Target | None, float]:
    """(the named target or None, usable GiB per device); hbm_gib > 0 replaces the target's memory."""
    if target and target not in TARGETS:
        raise ValueError(f"--target={target!r} is unknown; known targets: {', '.join(TARGETS)}")
    if hbm_gib < 0:
        raise ValueError(f"--hbm_gib={hbm_gib} must be >= 0 (0 = the target's memory, or no verdict)")
    kind = TARGETS.get(target)
    memory = hbm_gib or (kind.hbm_gib if kind else 0.0)
    fraction = gpu_memory_fraction() if kind and kind.compiler == "gpu" else 1.0
    return kind, memory * fraction


def judge(peak_bytes: float, usable_gib: float, target: Target | None, planned_on: str = "cpu") -> Fit:
    """The verdict for a peak planned by XLA's `planned_on` compiler, on `usable_gib` of one device of
    `target` (None: kind unknown)."""
    if target is not None and target.compiler == planned_on:
        margin = Margin(1.0, 1.0, "")
        where = "planned by the target's own compiler"
    elif target is not None and target.compiler in MEASURED_MARGINS:
        margin = MEASURED_MARGINS[target.compiler]
        where = f"measured for the XLA {target.compiler.upper()} compiler ({margin.source})"
    else:
        margin = WIDEST_MARGIN
        kind = f"the XLA {target.compiler.upper()} compiler" if target else "this device kind (pass --target)"
        where = f"not measured for {kind}; using {margin.source}"
    usable = usable_gib * GIB
    low, high = peak_bytes * margin.low, peak_bytes * margin.high
    if high <= usable:
        verdict = "fits with margin"
    elif low > usable:
        verdict = "does not fit"
    else:
        verdict = "uncertain"
    explanation = (
        f"the device's peak should lie between {low / GIB:.3g} and {high / GIB:.3g} GiB, "
        f"{margin.low:.2f}x to {margin.high:.2f}x this planner's {peak_bytes / GIB:.3g} GiB ({where}), "
        f"against {usable_gib:.3g} GiB usable per device"
    )
    return Fit(verdict, low, high, usable, margin, explanation)
