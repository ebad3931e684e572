"""The report lines of a plan compiled by XLA's GPU compiler for GPUs: where its figures come from, the fit (of
the memory JAX lets a program use), launches and bytes, the collectives over NVLink and the network between
nodes, and the roofline bound with its model."""
from __future__ import annotations

from bert_jax.plan import memory_fit
from bert_jax.plan.compiled_plan import GIB, PALLAS_FLOPS_SOURCE, fits
from bert_jax.plan.report_collectives import bound_line, collective_lines


def source(plan) -> tuple[str, str]:
    g = plan.gpus
    where = f"{g.label}: {g.total_chips} {g.chip.device_kind} ({g.topology})"
    return where, (f"Memory, launches and bytes below come from XLA's GPU compiler ({plan.compiler_version}) compiling "
                   f"for {where} on this host, from the card's target config (bert_jax/plan/gpu_targets/"
                   f"{g.chip.key}.txtpb): exact for this program, no band; FLOPs are the unoptimised program's dots "
                   "(bert_jax/plan/hlo_flops.py).")


def lines(plan, target: str, hbm_gib: float) -> list[str]:
    chip, (ok, usable) = plan.gpus.chip, fits(plan, hbm_gib)
    fraction = memory_fit.gpu_memory_fraction()
    memory = (f"{usable / GIB:.2f} GiB usable ({fraction:.0%} of "
              + (f"{hbm_gib:g} GiB, --hbm_gib" if hbm_gib else f"the {chip.device_memory_bytes / GIB:.2f} GiB the card "
                 "reports") + ", XLA_PYTHON_CLIENT_MEM_FRACTION)")
    if ok:
        verdict = f"**fits**: {plan.peak_bytes / GIB:.2f} GiB per GPU of {memory}, {(usable - plan.peak_bytes) / GIB:.2f} GiB free"
    else:
        verdict = (f"**does not fit**: {plan.peak_bytes / GIB:.2f} GiB per GPU against {memory}, "
                   f"{(plan.peak_bytes - usable) / GIB:.2f} GiB over")
    r = plan.roofline
    out = ["", verdict + " (XLA's GPU compiler's own figure)", ""]
    if plan.pallas_flops:
        out.append(f"The {plan.kernel} attention kernel is a custom call, its FLOPs invisible in the program's dots: "
                   f"added from {PALLAS_FLOPS_SOURCE[plan.kernel]}, {plan.pallas_flops:.4g} FLOPs per GPU; its bytes "
                   "are its operands and results in the program.")
    out += [
        f"Per GPU per step: {plan.traffic.launches:,.0f} kernel launches and {r.bytes / 1e9:.4g} GB through HBM "
        f"({r.bytes_per_token / 1e3:.4g} kB per token), each loop's body times its trips, every instruction's operands "
        "read and result written once (bert_jax/plan/hlo_traffic.py; no cache reuse); "
        f"FLOPs {r.flops:.4g} (formula {r.formula_flops:.4g}; the dots, rematerialisation included).",
        "",
        *collective_lines(plan, "GPU"),
        "",
        f"Roofline ({chip.device_kind}: {chip.peak_flops / 1e12:g} TFLOP/s bf16 dense, {chip.hbm_bytes_per_s / 1e9:g} GB/s "
        "HBM, data sheet). " + bound_line(r, "GPU") + " Launch overhead and GEMM efficiency are not in the bound; "
        "autotuning is off when compiling without a GPU.",
    ]
    return out
