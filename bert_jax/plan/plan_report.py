"""The Markdown report of one compiled step (`bert-jax plan`, bert_jax/plan/stage_report.py): memory, FLOPs, and
what the target's own report file adds: bytes, collectives and the roofline bound for a TPU slice
(report_tpu.py) or GPUs (report_gpu.py), a fit estimate for simulated CPU devices (report_cpu.py). A new kind of
target is a new report file and a row of REPORTS."""
from __future__ import annotations

from bert_jax.parallel import tpu_slices
from bert_jax.plan import gpu_cards, report_cpu, report_gpu, report_tpu
from bert_jax.plan.compiled_plan import GIB, Plan

REPORTS = {tpu_slices.TpuSlice: report_tpu, gpu_cards.GpuSet: report_gpu, type(None): report_cpu}


def format_plan(plan: Plan, target: str = "", hbm_gib: float = 0.0, max_rows: int = 0, param_table: bool = True) -> str:
    """The Markdown report of one compiled step; a fit verdict when a TPU slice, a target or hbm_gib is given; the
    parameter table (at most max_rows rows, 0 = all) unless param_table is False (`format_params`)."""
    report = REPORTS[type(plan.accelerator)]
    gib = lambda b: f"{b / GIB:.3f}"  # noqa: E731
    mesh = ", ".join(f"{k}={v}" for k, v in plan.mesh_shape.items())
    unit = "chip" if plan.tpu_slice else "device"
    where, source = report.source(plan)
    lines = [
        f"mesh ({mesh}) = {where}; {plan.param_count:,} parameters; attention kernel {plan.kernel or '?'}, "
        f"remat {plan.remat_policy or '?'}, scan_layers {plan.scan_layers}; compiled in {plan.compile_s:.1f} s",
        "",
        source,
        "",
        f"| per {unit} | GiB |",
        "|---|---|",
        f"| parameters | {gib(plan.param_bytes)} |",
        f"| optimizer state | {gib(plan.opt_state_bytes)} |",
        *([f"| frozen teacher parameters | {gib(plan.frozen_bytes)} |"] if plan.frozen_bytes else []),
        f"| temporaries (activations, gradients) | {gib(plan.temp_bytes)} |",
        f"| arguments / outputs / aliased (donated) | {gib(plan.argument_bytes)} / {gib(plan.output_bytes)} / "
        f"{gib(plan.alias_bytes)} |",
        f"| **peak** (arguments + outputs - aliased + temporaries) | **{gib(plan.peak_bytes)}** |",
        "",
        f"FLOPs per step: compiled {plan.compiled_flops:.4g} per {unit} x {plan.num_devices} = "
        f"{plan.compiled_flops * plan.num_devices:.4g}; formula {plan.formula_flops:.4g} "
        "(6*N*B*S + 12*layers*hidden*S*(S + R)*B for each network of the module, R DeBERTa's relative rows, "
        "+ 6*E*vocab*B*P with E the decoder's width, plus a teacher's forward, a third of that with its sizes, "
        "bert_jax/train/perf.py; "
        + ("the program's dots, every layer and rematerialisation counted, no elementwise work)" if plan.gpus else
           "the compiled count adds rematerialisation, optimizer and softmax/norm work"
           + ("; with scan_layers XLA counts the scanned layer once, not once per layer)"
              if plan.scan_layers and not plan.layers_counted else ")")),
    ]
    if plan.layers_counted:
        lines.append(f"({plan.layers_counted})")
    lines += report.lines(plan, target, hbm_gib)
    if param_table:
        lines += ["", format_params(plan, max_rows)]
    return "\n".join(lines)


def format_params(plan: Plan, max_rows: int = 0) -> str:
    """The Markdown table of the step's parameters: shapes, partition specs, per-device shapes (max_rows: 0 = all)."""
    rows = plan.params if max_rows <= 0 else plan.params[:max_rows]
    lines = ["| parameter | global shape | partition spec | per-device shape | dtype |", "|---|---|---|---|---|"]
    lines += [f"| {r.path} | {r.global_shape} | {r.spec} | {r.shard_shape} | {r.dtype} |" for r in rows]
    if len(rows) < len(plan.params):
        lines.append(f"| ... {len(plan.params) - len(rows)} more (--max_param_rows=0 for all) | | | | |")
    return "\n".join(lines)
