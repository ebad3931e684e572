"""Stages of one run (config.train.stages): one schedule, a checkpointed switch, DONE once at the end."""
import os
import shutil
import sys

import pytest

import bert_jax.configs.bert_base
import bert_jax.configs.tiny
from bert_jax.train import stages
from bert_jax.run.completion import read_done
from bert_jax.train.config_validation import resolve_config, validate_config
from bert_jax.train.optimizer import learning_rate_schedule

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_pretrain import micro_config, read_metrics, train_losses  # noqa: E402


def test_stages_split_the_run_and_re_derive_max_predictions():
    plan = stages.plan(bert_jax.configs.tiny.get_config("two_stage"))
    assert [(s.index, s.start, s.end) for s in plan] == [(0, 0, 240), (1, 240, 300)]
    assert [resolve_config(s.config).data.max_predictions_per_seq for s in plan] == [10, 20]
    assert [s.config.data.max_seq_length for s in plan] == [64, 128]
    assert len(stages.plan(bert_jax.configs.tiny.get_config())) == 1  # no stages: the run is one


def test_bert_base_runs_the_papers_90_10_recipe_as_one_config():
    config = bert_jax.configs.bert_base.get_config()
    plan = stages.plan(config)
    assert [(s.start, s.end, s.config.data.max_seq_length) for s in plan] == [(0, 900_000, 128),
                                                                            (900_000, 1_000_000, 512)]
    validate_config(resolve_config(config))  # seq 512's mask budget (77) included


def test_one_schedule_spans_the_stages():
    plan = stages.plan(bert_jax.configs.tiny.get_config("two_stage"))
    first, second = (learning_rate_schedule(s.config.train) for s in plan)
    for step in (0, 100, 239, 240, 299):
        assert float(first(step)) == float(second(step))  # no jump at the switch


@pytest.mark.parametrize("stage, message", [
    (dict(data=dict(max_seq_length=128)), r"stages\[0\] has no `start`"),
    (dict(start=400, data=dict(max_seq_length=128)), r"stages\[0\].start=400 must be an int in \(0, .*num_steps=300"),
    (dict(start=100, train=dict(learning_rate=1.0)), r"stages\[0\] changes train.learning_rate; a stage may change only"),
    (dict(start=100, data=dict(max_seq_length=128, max_predictions_per_seq=5)),
     r"stages\[0\] \(from step 100\): config.data.max_predictions_per_seq=5 caps"),
    (dict(start=100, data=dict(max_seq_length=1024)), r"stages\[0\] \(from step 100\): .*max_seq_length=1024 exceeds"),
])
def test_a_bad_stage_is_refused_at_config_time_naming_it(stage, message):
    config = bert_jax.configs.tiny.get_config("two_stage")
    config.train.stages = (stage,)
    with pytest.raises(ValueError, match=message):
        validate_config(resolve_config(config))


def _two_stage_micro():
    c = micro_config()  # 8 steps; seq 32 for 4 steps, then seq 64 and a batch of 4 for 4 more
    c.data.max_seq_length = 32
    c.data.max_predictions_per_seq = "auto"
    c.train.stages = (dict(start=4, data=dict(max_seq_length=64), train=dict(global_batch_size=4)),)
    c.checkpoint.every_steps = 2
    return c


@pytest.mark.slow  # four builds of the micro run (two per stage): ~2 minutes on 2 cores
def test_a_kill_in_the_second_stage_resumes_to_the_losses_of_a_straight_run(tmp_path, xla_compile_cache):
    from bert_jax.train.loop import train_and_evaluate  # noqa: PLC0415

    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    train_and_evaluate(_two_stage_micro(), straight)
    rows = read_metrics(straight)
    schedule = learning_rate_schedule(_two_stage_micro().train)
    assert [r["train/learning_rate"] for r in rows if "train/loss" in r] == [
        pytest.approx(float(schedule(s - 1))) for s in range(1, 9)]  # continuous across the switch at 4
    assert read_done(straight)["step"] == 8
    shutil.copytree(os.path.join(straight, "tokenizer"), os.path.join(killed, "tokenizer"))
    train_and_evaluate(_two_stage_micro(), killed, stop_at_step=4)  # at the switch
    assert read_done(killed) is None
    train_and_evaluate(_two_stage_micro(), killed, stop_at_step=6)  # inside stage 2: its iterator checkpointed
    assert read_done(killed) is None  # DONE only after the last stage
    train_and_evaluate(_two_stage_micro(), killed)
    assert train_losses(killed) == train_losses(straight)
    assert read_done(killed)["step"] == 8


def _cut_in_half(workdir: str, step: int) -> None:
    """The largest file of checkpoint `step` truncated, as a host dying mid-write leaves it."""
    state = os.path.join(workdir, "checkpoints", str(step), "state")
    files = [os.path.join(d, f) for d, _, names in os.walk(state) for f in names]
    largest = max(files, key=os.path.getsize)
    with open(largest, "r+b") as f:
        f.truncate(os.path.getsize(largest) // 2)


@pytest.mark.slow  # five builds of the micro run: ~2 minutes on 2 cores
def test_an_unreadable_checkpoint_that_sends_the_restore_back_across_a_switch_plans_the_stages_again(
        tmp_path, caplog, xla_compile_cache):
    """The soak's find: with the switch's checkpoint (step 4) cut, stage 2 restored step 2 and trained steps 3-4 at
    stage 2's config; with step 6 cut, step 4's checkpoint gave stage 2 stage 1's iterator position."""
    from bert_jax.train.loop import train_and_evaluate  # noqa: PLC0415

    straight, cut = str(tmp_path / "straight"), str(tmp_path / "cut")
    train_and_evaluate(_two_stage_micro(), straight)
    shutil.copytree(os.path.join(straight, "tokenizer"), os.path.join(cut, "tokenizer"))
    train_and_evaluate(_two_stage_micro(), cut, stop_at_step=6)
    _cut_in_half(cut, 6)  # back to 4, the switch: stage 2 with a new iterator, not step 4's stage 1 position
    train_and_evaluate(_two_stage_micro(), cut, stop_at_step=6)
    _cut_in_half(cut, 6)
    _cut_in_half(cut, 4)  # back to 2: stage 1 again, then stage 2
    train_and_evaluate(_two_stage_micro(), cut)
    rewound = [r.getMessage() for r in caplog.records if "planned again" in r.getMessage()]
    assert len(rewound) == 2 and "from step 4" in rewound[0] and "from step 2" in rewound[1], rewound
    assert {"4.corrupt", "6.corrupt", "6.corrupt.2"} <= set(os.listdir(os.path.join(cut, "checkpoints")))
    assert train_losses(cut) == train_losses(straight)
    assert read_done(cut)["step"] == 8
