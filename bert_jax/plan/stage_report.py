"""The report `plan` prints for a run: each stage's compiled step, then a table of the stages, the verdict of the
worst naming its stage, what would make a stage that does not fit fit, and (TPU) the run's length.

The end of the report is what a reader needs first (a terminal shows the end): the table and the verdict.
"""
from __future__ import annotations

from bert_jax.plan import plan_report, run_length, stage_fixes
from bert_jax.plan.stage_plans import DOES_NOT_FIT, GIB, SEVERITY, StagePlan, StagePlanner, worst

# One line: what "FLOPs per step" counts, as bert_jax/train/perf.py does (and MFU divides by).
FLOPS_FORMULA = ("FLOPs per step = 6*N*B*S + 12*layers*hidden*S^2*B + 6*E*vocab*B*P: forward and backward of "
                 "the whole step, N non-embedding parameters, B global batch, S sequence length, P predicted "
                 "positions per sequence (all S for a causal objective), E the decoder's width (plus DeBERTa's relative rows, a generator's attention, a teacher's "
                 "forward; bert_jax/train/perf.py)")


def report(planner: StagePlanner, stage_plans: list[StagePlan], target: str = "", max_rows: int = 0) -> tuple[str, bool]:
    """(the Markdown report, whether the run fits: no stage's verdict is "does not fit"). `target` names the
    CPU-compiler estimate's device kind (bert_jax/plan/memory_fit.py TARGETS), as --gpu / --target gave it."""
    judge = planner.judge
    lines = []
    for sp in stage_plans:
        lines += [f"## {sp.label}", "", _details(sp, judge, target), ""]
    first = next((sp.step.plan for sp in stage_plans if sp.step.plan is not None), None)
    if first is not None:
        lines += ["## parameters (the model is the run's: the same in every stage)", "",
                  plan_report.format_params(first, max_rows), ""]
    lines += ["## the run", "", *_table(stage_plans, judge.judges, judge.unit), "", FLOPS_FORMULA, ""]
    if not judge.judges:
        devices = first.num_devices if first else "the"
        lines.append(f"No verdict: these peaks are the XLA CPU compiler's, for {devices} simulated CPU devices. "
                     "`--gpu=h100` (or `--target`, `--hbm_gib`) judges each stage on a GPU, with the band measured "
                     "around this compiler's figures; `--tpu=v5e-16` compiles each stage with the TPU compiler for "
                     "that slice: exact memory per chip, a verdict, and the run's length.")
        return "\n".join(lines), True
    decider = worst(stage_plans)
    lines.append(_verdict(decider, stage_plans, judge))
    for sp in stage_plans:
        if not sp.step.verdict.fits:
            found = stage_fixes.fixes(planner, sp, later_stages=sp is not stage_plans[-1])
            lines += ["", f"What would make {sp.label} fit (each compiled):",
                      *stage_fixes.describe(found, sp, judge.unit)]
    ok = SEVERITY[decider.step.verdict.word] < SEVERITY[DOES_NOT_FIT]
    if ok and judge.tpu_slice is not None:
        lines.append(run_length.format_run_length([
            run_length.StageLength(run_length.stage_label(sp.stage.start, sp.stage.end, sp.step.config),
                                   sp.stage.end - sp.stage.start, sp.step.plan.roofline.step_s,
                                   sp.step.plan.num_devices, sp.step.plan.step_is_exact)
            for sp in stage_plans]))
    return "\n".join(lines), ok


def _details(sp: StagePlan, judge, target: str) -> str:
    step = sp.step
    if step.plan is None:
        return f"**{DOES_NOT_FIT}** on {judge.device}: {step.verdict.explanation}."
    return plan_report.format_plan(step.plan, target, judge.hbm_gib, param_table=False)


def _table(stage_plans: list[StagePlan], judged: bool, unit: str) -> list[str]:
    lines = [f"| stage | steps | seq | global batch | per {unit} (micro-batch x grad_accum_steps) | parameters | "
             f"FLOPs per step | peak per {unit} (GiB) | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for sp in stage_plans:
        s, step = sp.stage, sp.step
        c = step.config
        peak = (f"{step.plan.peak_bytes / GIB:.2f}" if step.plan is not None
                else f"> {step.verdict.needed_bytes / GIB:.2f} (refused)")
        lines.append(f"| {s.index} | {s.start + 1:,}-{s.end:,} | {c.data.max_seq_length} | {c.train.global_batch_size} | "
                     f"{step.per_device} ({step.micro_batch} x {c.train.grad_accum_steps}) | {step.param_count:,} | "
                     f"{step.formula_flops:.4g} | {peak} | {step.verdict.word if judged else '-'} |")
    return lines


def _verdict(decider: StagePlan, stage_plans: list[StagePlan], judge) -> str:
    v = decider.step.verdict
    if v.word == DOES_NOT_FIT:
        others = [sp.stage.index for sp in stage_plans if sp.step.verdict.word == DOES_NOT_FIT and sp is not decider]
        also = f"; nor does stage {', '.join(map(str, others))}" if others else ""
        return f"**{DOES_NOT_FIT}**: {decider.label} does not fit {judge.device}{also}: {v.explanation}."
    if v.word == "uncertain":
        return f"**uncertain**: {decider.label} may not fit {judge.device}: {v.explanation}."
    stages_ = "every stage" if len(stage_plans) > 1 else "the run"
    return (f"**{v.word}**: {stages_} on {judge.device}; the largest need is {decider.label}'s: "
            f"{v.explanation}.")
