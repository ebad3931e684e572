"""Ramps without hand-written stages: config.train.batch_size_warmup and config.data.mask_rate_schedule expand into
stages of one run (bert_jax/train/stages.py), merged with the declared ones, each checked, planned and resumed like
a declared stage."""
import json
import os
import shutil
import sys

import pytest

import bert_jax
import bert_jax.configs.tiny
from bert_jax.plan import stage_fixes
from bert_jax.plan.stage_plans import StagePlan
from bert_jax.run import experiment
from bert_jax.run.completion import read_done
from bert_jax.storage.workdir import Workdir
from bert_jax.train import resume, stages
from bert_jax.train.config_validation import check_config, resolve_config, validate_config
from bert_jax.train.optimizer import learning_rate_schedule

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_pretrain import micro_config, read_metrics, train_losses  # noqa: E402


def ramp_config(start=8, tokens=15_360, max_changes=8, num_steps=300):
    """8 -> 32 sequences of 64 tokens: each third of `tokens` (5,120) is one more multiple of the start batch."""
    c = bert_jax.configs.tiny.get_config()
    c.data.max_seq_length = 64
    c.train.update(global_batch_size=32, num_steps=num_steps, warmup_steps=10)
    c.train.batch_size_warmup.update(start_batch_size=start, tokens=tokens, max_changes=max_changes)
    return c


def _table(config):
    return [(s.start, s.end, s.config.train.global_batch_size) for s in stages.plan(config)]


def test_a_batch_ramp_grows_linearly_in_tokens_by_multiples_of_the_start_batch():
    # 8 x 64 = 512 tokens a step reach 5,120 after 10 steps; 16 x 64 add 5,120 in 5; 24 x 64 cross 15,360 in 4.
    assert _table(ramp_config()) == [(0, 10, 8), (10, 15, 16), (15, 19, 24), (19, 300, 32)]
    # Two changes at most: 8, 16 (at a third of the tokens), 32 (at all of them: 10,240 more at 1,024 a step).
    assert _table(ramp_config(max_changes=2)) == [(0, 10, 8), (10, 20, 16), (20, 300, 32)]
    plan = stages.plan(ramp_config())
    assert plan[0].source == "config.train.batch_size_warmup" and plan[0].changes == {"train.global_batch_size": 8}
    validate_config(resolve_config(ramp_config()))
    assert _table(ramp_config(start=32)) == [(0, 300, 32)]  # the start batch is the batch: nothing to ramp


def test_a_ramp_the_run_ends_before_finishing_stops_at_the_batch_it_reached():
    assert _table(ramp_config(num_steps=17)) == [(0, 10, 8), (10, 15, 16), (15, 17, 24)]


def test_a_ramp_counts_the_tokens_of_the_sequence_length_in_force():
    c = ramp_config()
    c.train.stages = (dict(start=12, data=dict(max_seq_length=128)),)
    # 10 steps of 8 x 64 (5,120); 16 x 64 for 2 steps to the declared switch (7,168), then 16 x 128 = 2,048 a step
    # crosses 10,240 after 2 more (11,264); 24 x 128 = 3,072 a step crosses 15,360 after 2 more.
    plan = stages.plan(c)
    assert [(s.start, s.config.train.global_batch_size, s.config.data.max_seq_length) for s in plan] == [
        (0, 8, 64), (10, 16, 64), (12, 16, 128), (14, 24, 128), (16, 32, 128)]
    assert [s.config.data.max_predictions_per_seq for s in plan] == [10, 10, 20, 20, 20]  # re-derived at seq 128
    assert (plan[2].source, plan[2].declared) == ("config.train.stages[0]", 0)


def test_a_mask_rate_schedule_sets_the_rate_from_each_step_and_re_derives_the_prediction_cap():
    c = ramp_config(start=0)
    c.data.mask_rate_schedule = ((0, 0.3), (50, 0.15), (200, 0.05))
    plan = stages.plan(c)
    assert [(s.start, s.end, s.config.data.mask_rate, s.config.data.max_predictions_per_seq) for s in plan] == [
        (0, 50, 0.3, 20), (50, 200, 0.15, 10), (200, 300, 0.05, 4)]  # ceil(rate x 64)
    assert [s.source for s in plan] == [f"config.data.mask_rate_schedule[{i}]" for i in range(3)]
    c.data.mask_rate_schedule = ((100, 0.3),)  # from step 100: stage 0 is the config as written
    assert [(s.start, s.config.data.mask_rate, s.source) for s in stages.plan(c)] == [
        (0, 0.15, ""), (100, 0.3, "config.data.mask_rate_schedule[0]")]


def test_ramps_merge_with_declared_stages_by_start_each_inheriting_what_came_before():
    c = ramp_config()
    c.data.mask_rate_schedule = ((0, 0.3), (15, 0.15))
    c.train.stages = (dict(start=15, train=dict(grad_accum_steps=2)), dict(start=100, data=dict(masking="whole_word")))
    plan = stages.plan(c)
    assert [(s.start, s.config.train.global_batch_size, s.config.data.mask_rate, s.config.train.grad_accum_steps,
             s.config.data.masking) for s in plan] == [
        (0, 8, 0.3, 1, "token"), (10, 16, 0.3, 1, "token"), (15, 24, 0.15, 2, "token"),
        (19, 32, 0.15, 2, "token"), (100, 32, 0.15, 2, "whole_word")]
    assert plan[0].source == "config.train.batch_size_warmup and config.data.mask_rate_schedule[0]"
    assert plan[2].source == ("config.train.stages[0] and config.train.batch_size_warmup and "
                              "config.data.mask_rate_schedule[1]") and plan[2].declared == 0
    first, *later = (learning_rate_schedule(s.config.train) for s in plan)
    for step in (0, 9, 10, 19, 150):
        assert all(float(first(step)) == float(schedule(step)) for schedule in later)  # one schedule
    validate_config(resolve_config(c))


def _bad(**keys):
    c = ramp_config(start=0)
    for key, value in keys.items():
        section, *rest = key.split("__")
        node = c[section]
        for part in rest[:-1]:
            node = node[part]
        node[rest[-1]] = value
    return c


@pytest.mark.parametrize("keys, message", [
    (dict(train__batch_size_warmup__start_batch_size=12),
     "config.train.batch_size_warmup.start_batch_size=12 must divide config.train.global_batch_size=32"),
    (dict(train__batch_size_warmup__start_batch_size=-8), "config.train.batch_size_warmup.start_batch_size=-8 must"),
    (dict(train__batch_size_warmup__start_batch_size=8, train__batch_size_warmup__tokens=0.0),
     "config.train.batch_size_warmup.tokens=0.0 must be > 0"),
    (dict(train__batch_size_warmup__start_batch_size=8, train__batch_size_warmup__max_changes=0),
     "config.train.batch_size_warmup.max_changes=0 must be an int >= 1"),
    (dict(train__batch_size_warmup__start_batch_size=8, train__batch_size_warmup__tokens=1e9,
          train__stages=(dict(start=5, train=dict(global_batch_size=16)),)),
     "config.train.stages[0] changes train.global_batch_size, which config.train.batch_size_warmup drives"),
    (dict(data__mask_rate_schedule=((0, 0.3), (5, 0.2), (5, 0.1))),
     "config.data.mask_rate_schedule[2] step 5 must be an int in [6, config.train.num_steps=300)"),
    (dict(data__mask_rate_schedule=((300, 0.3),)), "config.data.mask_rate_schedule[0] step 300 must be an int in [0,"),
    (dict(data__mask_rate_schedule=((-1, 0.3),)), "config.data.mask_rate_schedule[0] step -1 must be an int in [0,"),
    (dict(data__mask_rate_schedule=((0, 1.0),)), "config.data.mask_rate_schedule[0] rate 1.0 must be in (0, 1)"),
    (dict(data__mask_rate_schedule=((0, 0.0),)), "config.data.mask_rate_schedule[0] rate 0.0 must be in (0, 1)"),
    (dict(data__mask_rate_schedule=(0.3,)), "config.data.mask_rate_schedule[0]=0.3 must be a (step, rate) pair"),
    (dict(data__mask_rate_schedule=((10, 0.3),), train__stages=(dict(start=5, data=dict(mask_rate=0.2)),)),
     "config.train.stages[0] changes data.mask_rate, which config.data.mask_rate_schedule drives"),
    # A generated stage is checked as a whole config like a declared one, named by what generated it.
    (dict(train__batch_size_warmup__start_batch_size=8, train__batch_size_warmup__tokens=1e9,
          train__grad_accum_steps=16),
     "config.train.batch_size_warmup (from step 0): config.train.grad_accum_steps=16 must divide "
     "config.train.global_batch_size=8"),
    (dict(data__mask_rate_schedule=((10, 0.3),), data__max_predictions_per_seq=10, train__stages=(
        dict(start=10, data=dict(max_predictions_per_seq=10)),)),
     "config.train.stages[0] and config.data.mask_rate_schedule[0] (from step 10): "
     "config.data.max_predictions_per_seq=10 caps config.data.mask_rate=0.3"),
])
def test_a_bad_ramp_or_schedule_is_one_user_error_naming_the_key(keys, message):
    with pytest.raises(bert_jax.UserError) as refused:
        check_config(_bad(**keys))
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_a_generated_stage_that_does_not_fit_is_told_to_declare_its_accumulation_at_its_start():
    c = ramp_config()
    c.train.stages = (dict(start=15, data=dict(masking="whole_word")),)
    plan = stages.plan(c)
    assert (stage_fixes._accumulation_change(StagePlan(plan[1], None), 2, True)
            == "dict(start=10, train=dict(grad_accum_steps=2)) in config.train.stages "
               "(where config.train.batch_size_warmup starts stage 1)")
    assert (stage_fixes._accumulation_change(StagePlan(plan[2], None), 2, True)
            == "train=dict(grad_accum_steps=2) in config.train.stages[0]")


def test_a_resume_that_changes_a_ramp_or_schedule_is_refused_naming_the_key(tmp_path):
    c = ramp_config()
    c.data.mask_rate_schedule = ((0, 0.3), (50, 0.15))
    config = check_config(c)
    workdir = Workdir(str(tmp_path))
    os.makedirs(os.path.join(str(workdir.checkpoints), "20"))  # a checkpoint inside stage 3 (steps 20-50)
    recorded = json.loads(config.to_json_best_effort())
    workdir.config_json.write_text(json.dumps(recorded))
    assert resume.check_experiment(config, str(tmp_path)) == {}  # as recorded: lists, read back as tuples

    for key, value in (("train.batch_size_warmup.tokens", 30_720.0), ("data.mask_rate_schedule", ((0, 0.3),))):
        changed = c.copy_and_resolve_references()
        section, *rest = key.split(".")
        node = changed[section]
        for part in rest[:-1]:
            node = node[part]
        node[rest[-1]] = value
        changed = check_config(changed)
        with pytest.raises(experiment.ExperimentChangedError) as refused:
            resume.check_experiment(changed, str(tmp_path))
        first, *lines = str(refused.value).splitlines()
        assert first.endswith(f"--config.accept_changes={key}") and "step 20, stage " in first, first
        assert [line.split(":")[0] for line in lines] == [f"config.{key}"]
        with changed.unlocked():
            changed.accept_changes = key
        assert list(resume.check_experiment(changed, str(tmp_path))["accepted"]) == [key]


def _ramped_micro():
    """micro_config's 8 steps as a ramp and a schedule: batch 4 for 3 steps (4 x 32 tokens a step reach 384), then
    8; mask rate 0.3, then 0.15 from step 5: stages (0, 3], (3, 5], (5, 8]."""
    c = micro_config()
    c.data.max_seq_length = 32
    c.data.max_predictions_per_seq = "auto"
    c.train.batch_size_warmup.update(start_batch_size=4, tokens=384.0)
    c.data.mask_rate_schedule = ((0, 0.3), (5, 0.15))
    c.checkpoint.every_steps = 2
    return c


@pytest.mark.slow  # builds the micro run seven times (three stages, resumed twice): minutes on 2 cores
def test_a_ramped_run_killed_in_later_stages_resumes_to_the_losses_of_a_straight_run(tmp_path, xla_compile_cache):
    from bert_jax.train.loop import train_and_evaluate  # noqa: PLC0415

    plan = stages.plan(_ramped_micro())
    assert [(s.start, s.end, s.config.train.global_batch_size, s.config.data.mask_rate,
             s.config.data.max_predictions_per_seq) for s in plan] == [(0, 3, 4, 0.3, 10), (3, 5, 8, 0.3, 10),
                                                                       (5, 8, 8, 0.15, 5)]
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    train_and_evaluate(_ramped_micro(), straight)
    rows = [r for r in read_metrics(straight) if "train/loss" in r]
    schedule = learning_rate_schedule(_ramped_micro().train)
    assert [r["train/learning_rate"] for r in rows] == [pytest.approx(float(schedule(s - 1))) for s in range(1, 9)]
    masked = [r["train/masked_fraction"] for r in rows]
    assert min(masked[:5]) > 0.2 and max(masked[5:]) < 0.2, masked  # 30 % for 5 steps, then 15 %
    assert read_done(straight)["step"] == 8
    shutil.copytree(os.path.join(straight, "tokenizer"), os.path.join(killed, "tokenizer"))
    train_and_evaluate(_ramped_micro(), killed, stop_at_step=4)  # inside the second stage (batch 8)
    assert read_done(killed) is None
    train_and_evaluate(_ramped_micro(), killed, stop_at_step=7)  # inside the third (mask rate 0.15)
    assert read_done(killed) is None
    train_and_evaluate(_ramped_micro(), killed)
    assert train_losses(killed) == train_losses(straight)
    assert read_done(killed)["step"] == 8


@pytest.mark.slow  # compiles four stages of a 1-layer model: seconds each, over the default suite's budget
def test_plan_plans_each_generated_stage_like_a_declared_one():
    from test_plan_stages import two_stage_config  # noqa: PLC0415

    from bert_jax.plan import stage_report  # noqa: PLC0415
    from bert_jax.plan.stage_plans import Judge, StagePlanner  # noqa: PLC0415

    c = two_stage_config()  # seq 16, batch 8, 100 steps; seq 64 from step 80
    c.train.batch_size_warmup.update(start_batch_size=2, tokens=640.0, max_changes=1)  # 2 x 16 a step: 20 steps
    c.data.mask_rate_schedule = ((0, 0.3), (50, 0.15))
    planner = StagePlanner(Judge.of(), {})
    planned = planner.stages(c)
    text, fits = stage_report.report(planner, planned)
    print(text[text.find("## the run"):])
    assert fits and len(planner.cache) == 4  # each stage's own step compiled
    assert [sp.step.config.data.max_predictions_per_seq for sp in planned] == [5, 5, 3, 10]  # ceil(rate x seq)
    for index, steps, seq, batch in ((0, "1-20", 16, 2), (1, "21-50", 16, 8), (2, "51-80", 16, 8),
                                     (3, "81-100", 64, 8)):
        assert f"| {index} | {steps} | {seq} | {batch} | {batch} ({batch} x 1) |" in text
