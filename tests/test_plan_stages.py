"""`plan` plans every stage of a run: each stage's step compiled and judged, the run's verdict its worst stage's,
named, with the changes that would make it fit, each compiled; plain `plan` says per stage what a step is and which
flag gives a verdict; bad flags are one-line user errors.

In this process (one CPU device): a 1-layer model in two stages, seq 16 then 64, compiles in seconds; the judged
planner reuses the plain one's compiles.
"""
import os
import subprocess
import sys

import pytest

import bert_jax.configs.tiny
from bert_jax import UserError
from bert_jax.commands.plan import check_flags
from bert_jax.plan import compiled_plan, stage_fixes, stage_report
from bert_jax.plan.stage_plans import GIB, Judge, StagePlanner, Verdict


def two_stage_config():
    c = bert_jax.configs.tiny.get_config()
    c.model.update(vocab_size=512, hidden_size=32, num_heads=2, intermediate_size=64, max_position_embeddings=64,
                   num_layers=1, remat_policy="full")  # no policy saves more: the fixes compile accumulation alone
    c.data.max_seq_length = 16
    c.train.update(global_batch_size=8, num_steps=100)
    c.train.stages = (dict(start=80, data=dict(max_seq_length=64)),)
    return c


@pytest.fixture(scope="module")
def planned():
    config, cache = two_stage_config(), {}
    plain = StagePlanner(Judge.of(), cache)
    plain_stages = plain.stages(config)
    plain_text, plain_fits = stage_report.report(plain, plain_stages)
    compiled = len(cache)
    p0, p1 = (sp.step.plan.peak_bytes for sp in plain_stages)
    low, high = 1.29, 0.64  # memory_fit's widest band: stage 0 fits with margin below, stage 1 exceeds above
    assert high * p1 > low * p0, (p0, p1)  # seq 64 needs more than twice seq 16's memory
    usable = (low * p0 + high * p1) / 2
    judged = StagePlanner(Judge.of(hbm_gib=usable / GIB), cache)
    judged_stages = judged.stages(config)
    compiled_by_judge = len(cache) - compiled
    text, fits = stage_report.report(judged, judged_stages)
    found = stage_fixes.fixes(judged, judged_stages[1], later_stages=False)  # the report's, from the cache
    return dict(plain_stages=plain_stages, plain_text=plain_text, plain_fits=plain_fits, stages=judged_stages,
                text=text, fits=fits, fixes=found, usable=usable, compiled=compiled,
                compiled_by_judge=compiled_by_judge, planner=judged)


@pytest.mark.slow  # compiles each stage of a two-stage model: the default suite's time budget (2 cores): run with -m slow
def test_plain_plan_prints_each_stage_and_the_flags_that_give_a_verdict(planned):
    text = planned["plain_text"]
    params = planned["plain_stages"][0].step.param_count
    for sp, seq in zip(planned["plain_stages"], (16, 64)):
        step = sp.step
        assert step.config.data.max_seq_length == seq and step.verdict.word == ""
        assert step.formula_flops == step.plan.formula_flops  # bert_jax/train/perf.py's, for this stage's shapes
        assert (f"| {sp.stage.index} | {sp.stage.start + 1:,}-{sp.stage.end:,} | {seq} | 8 | 8 (8 x 1) | {params:,} | "
                f"{step.formula_flops:.4g} | {step.plan.peak_bytes / GIB:.2f} | - |") in text
    flops = [sp.step.formula_flops for sp in planned["plain_stages"]]
    assert flops[1] > 4 * flops[0]  # 4x the tokens, and attention grows with S^2
    assert "FLOPs per step = 6*N*B*S + 12*layers*hidden*S^2*B + 6*E*vocab*B*P" in text
    assert "No verdict" in text and "`--gpu=h100`" in text and "`--tpu=v5e-16`" in text
    assert planned["plain_fits"] and "**does not fit**" not in text


@pytest.mark.slow  # compiles each stage of a two-stage model: the default suite's time budget (2 cores): run with -m slow
def test_the_run_is_judged_by_its_worst_stage_and_the_report_names_it(planned):
    assert [sp.step.verdict.word for sp in planned["stages"]] == ["fits with margin", "does not fit"]
    assert not planned["fits"]
    assert "**does not fit**: stage 1 (steps 81-100, seq 64, batch 8) does not fit a device" in planned["text"]
    assert "| 1 | 81-100 | 64 | 8 | 8 (8 x 1) |" in planned["text"]


@pytest.mark.slow  # compiles each stage of a two-stage model: the default suite's time budget (2 cores): run with -m slow
def test_a_stage_that_does_not_fit_gets_its_own_grad_accum_steps_compiled_to_fit(planned):
    fix = planned["fixes"].found[0]
    accum = fix.step.config.train.grad_accum_steps
    assert fix.change == f"train=dict(grad_accum_steps={accum}) in config.train.stages[0]" and fix.scope == "stage 1"
    assert accum > 1 and fix.step.config.data.max_seq_length == 64 and fix.step.micro_batch == 8 // accum
    assert fix.step.verdict.fits and fix.step.plan.peak_bytes * 1.29 <= planned["usable"]  # within the band's top
    assert fix.step.micro_batch <= planned["fixes"].largest_micro_batch < 8
    assert f"`{fix.change}` (stage 1)" in planned["text"] and "a smaller per-device batch: at most" in planned["text"]


@pytest.mark.slow  # compiles each stage of a two-stage model: the default suite's time budget (2 cores): run with -m slow
def test_a_judge_reuses_the_stages_compiles(planned):
    assert planned["compiled"] == 2 and planned["compiled_by_judge"] == 0
    cache = planned["planner"].cache
    before = len(cache)
    stage_fixes.fixes(planned["planner"], planned["stages"][1], later_stages=False)
    assert len(cache) == before  # the fixes' compiles were the report's


@pytest.mark.slow  # compiles each stage of a two-stage model: the default suite's time budget (2 cores): run with -m slow
def test_a_stage_the_run_would_refuse_is_named_before_it_compiles(planned):
    config = two_stage_config()
    config.train.stages = (dict(start=80, data=dict(max_seq_length=128)),)
    with pytest.raises(ValueError, match=r"config.train.stages\[0\] \(from step 80\): config.data.max_seq_length=128 "
                                         r"exceeds config.model.max_position_embeddings=64"):
        StagePlanner(Judge.of(), planned["planner"].cache).stages(config)  # stage 0 is the fixture's


def test_a_step_the_tpu_compiler_refuses_bounds_the_micro_batch_by_what_it_needed():
    refused = compiled_plan.DoesNotFit("does not fit: ...", needed_gib=41.0, available_gib=15.75)
    verdict = Judge.refusal(refused)
    assert verdict.word == "does not fit" and not verdict.fits
    assert verdict.largest_micro_batch(64) == pytest.approx(64 * 15.75 / 41.0)  # 24.6: 16 is the next to try
    assert not Verdict("", "", 1.0, float("inf")).fits  # no verdict is no fit to suggest from


@pytest.mark.parametrize("flags, culprit", [
    (dict(argv=["plan", "extra"]), "unexpected arguments ['extra']"),
    (dict(gpu="h1000"), "--gpu='h1000' is not a GPU kind the planner knows; known: h100"),
    (dict(target="tpu_v9"), "--target='tpu_v9'"),
    (dict(gpu="h100", target="a100_40gb"), "--gpu=h100 and --target=a100_40gb"),
    (dict(tpu="v5e-4", gpu="h100"), "--tpu=v5e-4 compiles for a TPU slice"),
    (dict(search=True), "--search needs --tpu=SLICE"),
    (dict(num_slices=2), "--num_slices=2 needs --tpu=SLICE"),
    (dict(num_devices=0), "--num_devices=0 must be >= 1"),
    (dict(hbm_gib=-1.0), "--hbm_gib=-1 must be >= 0"),
    (dict(enough_mfu=1.5), "--search_enough_mfu=1.5 must be in [0, 1]"),
])
def test_bad_plan_flags_are_one_line_user_errors(flags, culprit):
    given = dict(argv=["plan"], tpu="", gpu="", cpu=False, target="", search=False, num_slices=1, num_devices=8,
                 hbm_gib=0.0, enough_mfu=0.98)
    given.update(flags)
    with pytest.raises(UserError) as error:
        check_flags(**given)
    assert culprit in str(error.value) and "\n" not in str(error.value)


def test_good_plan_flags_name_the_device_kind_to_judge_on():
    given = dict(argv=["plan"], tpu="", gpu="", cpu=False, target="", search=False, num_slices=1, num_devices=1,
                 hbm_gib=0.0, enough_mfu=0.98)
    assert check_flags(**{**given, "gpu": "h100"}) == "h100"
    assert check_flags(**{**given, "target": "tpu_v4"}) == "tpu_v4"
    assert check_flags(**{**given, "tpu": "v5e-4", "search": True}) == ""


@pytest.mark.slow
def test_bert_base_on_one_h100_names_its_seq_512_stage_as_not_fitting():
    """Issue 50's acceptance: the plan once said "fits with margin" (39.5 GiB, seq 128) for a run whose phase 2 at
    seq 512 (183 GiB) runs out of memory 90 % of the way in. --cpu: the CPU compiler's band, with the GPU compiler
    installed or not (tests/test_plan_gpu.py plans it with the GPU compiler)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "bert_jax.commands.plan", "--config=configs/bert_base.py", "--gpu=h100",
                           "--cpu", "--num_devices=1", "--max_param_rows=1"], cwd=repo, capture_output=True, text=True,
                          timeout=3600, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    out = proc.stdout
    print(out[out.find("## the run"):])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "| 0 | 1-900,000 | 128 | 256 | 256 (256 x 1) |" in out and "| fits with margin |" in out
    assert "| 1 | 900,001-1,000,000 | 512 | 256 | 256 (256 x 1) |" in out
    assert ("**does not fit**: stage 1 (steps 900,001-1,000,000, seq 512, batch 256) does not fit NVIDIA H100 80GB"
            in out)
    assert "in config.train.stages[0]` (stage 1)" in out  # its own grad_accum_steps, compiled to fit
