"""The report lines of a plan compiled by the TPU compiler for a TPU slice: where its figures come from, the fit,
the bytes, the collectives over ICI and DCN, and the roofline bound with its model."""
from __future__ import annotations

from bert_jax.plan.compiled_plan import GIB, PALLAS_FLOPS_SOURCE, fits
from bert_jax.plan.report_collectives import bound_line, collective_lines


def source(plan) -> tuple[str, str]:
    s = plan.tpu_slice
    where = f"{s.label}: {s.total_chips} {s.chip.device_kind} chips ({s.topology})"
    return where, (f"Memory, FLOPs and bytes below come from the TPU compiler ({plan.compiler_version}) compiling for "
                   f"{where}, with LIBTPU_INIT_ARGS={plan.libtpu_init_args!r}: exact for this program, no band.")


def lines(plan, target: str, hbm_gib: float) -> list[str]:
    chip = plan.tpu_slice.chip
    ok, usable = fits(plan, hbm_gib)
    memory = f"{hbm_gib:g} GiB (--hbm_gib)" if hbm_gib else f"{chip.hbm_gib:g} GiB of HBM"
    if ok:
        verdict = f"**fits**: {plan.peak_bytes / GIB:.2f} GiB of {memory} per chip ({(usable - plan.peak_bytes) / GIB:.2f} GiB free)"
    else:
        verdict = (f"**does not fit**: {plan.peak_bytes / GIB:.2f} GiB per chip against {memory}, "
                   f"{(plan.peak_bytes - usable) / GIB:.2f} GiB over")
    r = plan.roofline
    out = ["", verdict, ""]
    if plan.pallas_flops:
        out.append(f"The {plan.kernel} kernel is Pallas, its FLOPs invisible to the compiler's count: added from "
                   f"{PALLAS_FLOPS_SOURCE[plan.kernel]}, {plan.pallas_flops:.4g} FLOPs per chip; its bytes are "
                   "its operands and results in the program.")
    out += [
        f"Bytes per chip per step: {r.bytes / 1e9:.4g} GB through HBM ({r.bytes_per_token / 1e3:.4g} kB per token), "
        f"of the compiler's {plan.bytes_accessed / 1e9:.4g} GB accessed ({plan.on_chip_bytes / 1e9:.4g} GB stay in "
        "on-chip memory, bert_jax/plan/hlo_traffic.py); "
        f"FLOPs per chip: {r.flops:.4g} (formula {r.formula_flops:.4g}).",
        "",
        *collective_lines(plan, "chip"),
        "",
        f"Roofline ({chip.device_kind}: {chip.peak_flops / 1e12:g} TFLOP/s bf16, {chip.hbm_bytes_per_s / 1e9:g} GB/s HBM, "
        "data sheet). " + bound_line(r, "chip", flops_counted=plan.step_is_exact),
    ]
    return out
