"""The report lines of a plan compiled for simulated CPU devices: where its figures come from, and a fit verdict
on an accelerator within the band measured around the CPU compiler's figure (bert_jax/plan/memory_fit.py)."""
from __future__ import annotations

from bert_jax.plan import memory_fit


def source(plan) -> tuple[str, str]:
    """(where: the devices, source: the sentence saying whose figures these are)."""
    c = plan.compiler.upper()
    return (f"{plan.num_devices} devices",
            f"Memory and FLOPs below come from the XLA {c} compiler ({plan.compiler_version}) compiling for "
            f"{plan.num_devices} simulated {c} device(s): parameter and optimizer bytes are exact, temporaries are this "
            "compiler's schedule and differ on accelerators: any accelerator figure from them is an estimate.")


def lines(plan, target: str, hbm_gib: float) -> list[str]:
    """The collectives' bytes (no link: simulated devices) and the fit verdict, when a target or memory is given."""
    out = []
    if plan.collectives:
        sent = sum(c.within_bytes for c in plan.collectives)
        kinds = sorted({c.op for c in plan.collectives})
        out.append(f"\nCollectives: {len(plan.collectives)} ({', '.join(kinds)}), {sent / 1e9:.4g} GB sent per device "
                   "per step by the ring factors (bert_jax/plan/collectives.py); simulated devices have no link, so no "
                   "time: plan with --tpu or --gpu for one.")
    kind, usable_gib = memory_fit.resolve_target(target, hbm_gib)
    if usable_gib > 0:
        fit = memory_fit.judge(plan.peak_bytes, usable_gib, kind, planned_on=plan.compiler)
        device = kind.name if kind else "an unknown device kind"
        if kind and kind.compiler == "gpu":
            device += (f" ({hbm_gib or kind.hbm_gib:g} GiB, of which JAX lets a program use "
                       f"{memory_fit.gpu_memory_fraction():.0%}, XLA_PYTHON_CLIENT_MEM_FRACTION)")
        out.append(f"\n**{fit.verdict}** on {device} (an estimate): {fit.explanation}")
    return out
