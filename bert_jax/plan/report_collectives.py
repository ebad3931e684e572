"""The collectives part of a plan's report: every collective of the step, the link it crosses, its time at the
data sheet's bandwidth, and the bound's model (which term binds). Shared by the TPU and GPU reports."""
from __future__ import annotations

from collections import defaultdict

from bert_jax.plan import collectives as collective_ops
from bert_jax.plan.roofline import Roofline

MAX_ROWS = 12


def _where(op_name: str) -> str:
    """The JAX op a collective came from, without jit's prefix and the autodiff wrappers: enough to tell the
    layers' gathers from the head's."""
    text = op_name.replace("jit(train_step)/", "")
    for wrapper in ("transpose(jvp(", "jvp("):
        text = text.replace(wrapper, "")
    return text.replace(")", "")[-70:]


def collective_lines(plan, unit: str) -> list[str]:
    """A table of the step's collectives (the same op, group, mesh axes, link and mode summed, largest first) and
    each link's total; [] for a step with none."""
    found = plan.collectives
    if not found:
        return [f"No collectives: nothing crosses between {unit}s."]
    links = plan.links
    within, between = links.within, links.between
    between_name = links.between_name
    rows: dict = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, ""])
    for c in found:
        link = between_name if (c.crosses or c.domains > 1) and not c.within_bytes else (
            f"{within.name} + {between_name}" if c.domains > 1 else within.name)
        axes = "+".join(collective_ops.mesh_axes(c.group, plan.mesh_shape)) or "?"
        key = (c.op, c.group_size, axes, link, c.asynchronous)
        row = rows[key]
        row[0] += c.times
        row[1] += c.payload * c.times
        row[2] += c.within_bytes
        row[3] += c.between_bytes
        row[4] = row[4] or _where(c.op_name)
    ordered = sorted(rows.items(), key=lambda kv: -(kv[1][2] + kv[1][3]))
    lines = [f"Collectives per {unit} per step (bert_jax/plan/collectives.py: the optimised program's, each loop's "
             f"trips counted; sent = the ring factor x payload, two-level where a group spans {between_name}):", "",
             f"| collective | group n | mesh axes | runs | payload GB | factor | sent over {within.name} GB | "
             f"sent over {between_name} GB | time ms | mode | e.g. |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (op, n, axes, link, asynchronous), (times, payload, w, b, where) in ordered[:MAX_ROWS]:
        seconds = w / within.bytes_per_s + (b / between.bytes_per_s if between else 0.0)
        lines.append(f"| {op} | {n} | {axes} | {times:,.0f} | {payload / 1e9:.4g} | "
                     f"{collective_ops.FACTOR_TEXT[op]} | "
                     f"{w / 1e9:.4g} | {b / 1e9:.4g} | {seconds * 1e3:.3g}{'' if between or not b else ' + ?'} | "
                     f"{'async' if asynchronous else 'sync'} | {where} |")
    if len(ordered) > MAX_ROWS:
        rest = ordered[MAX_ROWS:]
        lines.append(f"| ... {len(rest)} more kinds | | | | {sum(r[1][1] for r in rest) / 1e9:.4g} | | "
                     f"{sum(r[1][2] for r in rest) / 1e9:.4g} | {sum(r[1][3] for r in rest) / 1e9:.4g} | | | |")
    total_w, total_b = sum(c.within_bytes for c in found), sum(c.between_bytes for c in found)
    lines += ["", f"{within.name}: {total_w / 1e9:.4g} GB sent per {unit} per step at {within.bytes_per_s / 1e9:g} GB/s "
              f"({within.source})."]
    if total_b:
        lines.append(f"{between_name}: {total_b / 1e9:.4g} GB sent per {unit} per step at "
                     + (f"{between.bytes_per_s / 1e9:g} GB/s ({between.source})." if between else
                        "no data-sheet figure (bert_jax/plan/links.toml): no time, not in the bound."))
    return lines


def bound_line(r: Roofline, unit: str, flops_counted: bool = True) -> str:
    """The bound's model in words: every term, which binds, what it allows; flops_counted=False: the compute term
    counts a loop's body once (a screened plan), so the bound and MFU are not the step's, and it says so."""
    terms = ", ".join(f"{name} {seconds * 1e3:.2f} ms" + (" (async)" if name not in ("compute", "memory") else "")
                      for name, seconds in r.terms.items())
    serial = f" + {r.serial_s * 1e3:.2f} ms of synchronous collectives" if r.serial_s else ""
    return (f"Step bound = max(compute, HBM memory, each link's asynchronous collectives) + synchronous collectives: "
            f"max({terms}){serial} -> step >= {r.step_s * 1e3:.2f} ms, **{r.bound}**; at most "
            f"{r.tokens_per_s:,.0f} tokens/s per {unit}, **MFU <= {r.mfu:.1%}**."
            + ("" if flops_counted else " Not this step's bound: its FLOPs count each loop's body once (compute too "
               "low); the bytes and collectives are exact."))
