"""config.train.budget: a run sized by wall-clock time, tokens or FLOPs, every schedule run by the fraction spent."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import bert_jax
import bert_jax.configs.tiny
from bert_jax.plan import budget_plan, gpu_cards
from bert_jax.run.completion import read_done
from bert_jax.storage.workdir import config_from_json
from bert_jax.train import budget, counters, stages
from bert_jax.train.budget_clock import BudgetClock
from bert_jax.train.config_validation import check_config
from bert_jax.train.optimizer import learning_rate_schedule

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_pretrain import REPO, micro_config, micro_overrides, read_metrics  # noqa: E402


@pytest.mark.parametrize("text, amount, unit", [
    ("8m", 480.0, "seconds"), ("24h", 86400.0, "seconds"), ("1.5h", 5400.0, "seconds"), ("90s", 90.0, "seconds"),
    ("2d", 172800.0, "seconds"), ("2e9tokens", 2e9, "tokens"), ("3e18flops", 3e18, "flops"),
    ("1000000 tokens", 1e6, "tokens"),
])
def test_a_budget_is_a_time_a_token_count_or_a_flop_count(text, amount, unit):
    parsed = budget.parse(text)
    assert (parsed.amount, parsed.unit) == (amount, unit)


@pytest.mark.parametrize("text", ["8x", "0m", "-1h", "tokens", "8 minutes", "2e9", "1e999flops", "inf h"])
def test_a_bad_budget_fails_in_one_line_naming_the_key_before_anything_is_created(text, tmp_path):
    config = micro_config()
    config.train.budget = text
    workdir = tmp_path / "run"
    with pytest.raises(bert_jax.UserError, match=r"^config.train.budget='.*' is not a budget; give a wall-clock time") \
            as refused:
        check_config(config, str(workdir))
    assert "\n" not in str(refused.value) and not workdir.exists()


@pytest.mark.parametrize("key, value, named", [
    ("branch_from", "/runs/parent:100", "config.branch_from"),
    ("data.mixture_schedule", ((4, dict(web=1.0)),), "config.data.mixture_schedule"),
    ("data.mixture_alpha_schedule", ((4, 0.5),), "config.data.mixture_alpha_schedule"),
    ("train.new_rows_warmup_steps", 4, "config.train.new_rows_warmup_steps"),
])
def test_a_budget_with_a_schedule_it_cannot_drive_is_refused_in_one_line_naming_both_keys(key, value, named,
                                                                                          tmp_path):
    config = micro_config()
    config.train.budget = "1e6tokens"
    section, _, leaf = key.rpartition(".")
    with (config[section] if section else config).unlocked():
        (config[section] if section else config)[leaf] = value
    with pytest.raises(ValueError, match=rf"^config.train.budget='1e6tokens' and {named}: "):
        budget.resolve(config)
    if key == "branch_from":
        return  # check_config reads the parent first (branch.resolve), and refuses one that is not there
    workdir = tmp_path / "run"
    with pytest.raises(bert_jax.UserError, match=rf"^config.train.budget='1e6tokens' and {named}: ") as refused:
        check_config(config, str(workdir))  # what pretrain runs first: exit 2 on a UserError
    assert "\n" not in str(refused.value) and not workdir.exists()


def _step_keyed_looking_keys() -> tuple[dict[str, str], set[str]]:
    """({key: a config that sets it} of every key of every config file's configs (each variant too) whose name
    counts steps or places something on the schedule (a step, a share of it), or whose value is (step, value)
    pairs; every key they hold)."""
    import importlib
    import pkgutil
    import re

    import bert_jax.configs
    looks = re.compile(r"step|schedule|every|warmup|stage|ramp|until|fraction|switch")
    found, every = {}, set()
    for module in pkgutil.iter_modules(bert_jax.configs.__path__):
        config_file = importlib.import_module(f"bert_jax.configs.{module.name}")
        if not hasattr(config_file, "get_config"):
            continue
        variants = [()] + [(v,) for v in getattr(config_file, "VARIANTS", ())]
        for variant in variants:
            for key, value in stages.flat(config_file.get_config(*variant)).items():
                every.add(key)
                pairs = (isinstance(value, (tuple, list)) and value and all(
                    isinstance(e, (tuple, list)) and len(e) == 2 and isinstance(e[0], int) for e in value))
                if looks.search(key) or pairs:
                    found.setdefault(key, f"configs/{module.name}.py{':' + variant[0] if variant else ''}")
    return found, every


def test_every_step_keyed_key_is_driven_by_the_budget_clock_or_refused():
    """A new step-keyed key fails here until bert_jax/train/step_keyed.py says what a budget does with it."""
    from bert_jax.train import step_keyed
    found, every = _step_keyed_looking_keys()
    assert "data.mixture_alpha_schedule" in found and "train.warmup_steps" in found  # the scan sees them
    missing = {key: where for key, where in found.items() if key not in step_keyed.STEP_KEYED
               and not any(key.startswith(k + ".") for k, (kind, _) in step_keyed.STEP_KEYED.items()
                           if kind != step_keyed.NOT_STEPS)}
    assert missing == {}, f"step-keyed keys bert_jax/train/step_keyed.py does not list: {missing}"
    stale = [key for key in step_keyed.STEP_KEYED if key not in every and not any(k.startswith(key + ".")
                                                                                  for k in every)]
    assert stale == [], f"bert_jax/train/step_keyed.py lists keys no config holds (renamed?): {stale}"


def _token_budget(config, steps: int):
    """`config` with a token budget of `steps` of its stage 0's steps."""
    config.train.budget = f"{steps * config.train.global_batch_size * config.data.max_seq_length}tokens"
    return config


def test_a_token_budget_runs_the_schedule_as_written_over_the_fraction_spent():
    config = _token_budget(micro_config(), 16)  # the schedule as written: 8 steps, warmup 2, linear decay to 0
    resolved, lines = budget.resolve(config)
    assert resolved.train.num_steps == 16 and "config.train.num_steps=16" in lines[0]
    written, run = learning_rate_schedule(micro_config().train), learning_rate_schedule(resolved.train)
    for step in range(1, 9):  # run step 2s is the schedule's step s: half the budget spent at half the schedule
        assert float(run(2 * step - 1)) == pytest.approx(float(written(step - 1)), rel=1e-6), step
    assert float(run(15)) == pytest.approx(float(written(7)), rel=1e-6)  # the last step: the last as written
    assert BudgetClock.of(resolved.train).fraction(16) == 1.0 and BudgetClock.of(resolved.train).fraction(4) == 0.25


def test_stage_switches_and_ramps_happen_at_their_share_of_the_budget():
    config = bert_jax.configs.tiny.get_config("two_stage")  # seq 64 to step 240 of 300, then seq 128
    config.train.budget = "3e6tokens"
    resolved, _ = budget.resolve(config)
    plan = stages.plan(resolved)
    # As written the run costs 240 x 32 x 64 + 60 x 32 x 128 = 737,280 tokens: each stage's steps x 3e6 / that,
    # rounded down, so the switch keeps its 80 % of the steps and comes at the share of tokens it had as written.
    assert [(s.start, s.end, s.config.data.max_seq_length) for s in plan] == [(0, 976, 64), (976, 1220, 128)]
    clock = BudgetClock.of(resolved.train)
    assert clock.fraction(976) == 976 * 32 * 64 / 3e6 and clock.fraction(1220) == (976 * 2048 + 244 * 4096) / 3e6
    assert 1 - 4096 / 3e6 < clock.fraction(1220) <= 1  # spent to within a step
    assert all(s.config.train.num_steps == 1220 for s in plan)  # the run's end, in every stage's config
    run = learning_rate_schedule(resolved.train)
    rates = [float(run(count)) for count in range(973, 979)]
    assert all(a > b for a, b in zip(rates, rates[1:]))  # still decaying through the switch: one schedule

    ramped = micro_config()
    ramped.train.batch_size_warmup.start_batch_size, ramped.train.batch_size_warmup.tokens = 4, 8 * 64 * 4
    written = [(s.start, s.end, s.config.train.global_batch_size) for s in stages.plan(ramped)]
    cost = sum((end - start) * batch * 64 for start, end, batch in written)  # the tokens of the schedule as written
    ramped.train.budget = f"{2 * cost}tokens"
    budgeted = [(s.start, s.end, s.config.train.global_batch_size) for s in stages.plan(budget.resolve(ramped)[0])]
    assert budgeted == [(2 * start, 2 * end, batch) for start, end, batch in written]  # twice the tokens: stretched
    ramped.train.budget = f"{cost}tokens"  # exactly what the schedule as written costs: the run as written
    exact = budget.resolve(ramped)[0]
    assert [(s.start, s.end) for s in stages.plan(exact)] == [(s, e) for s, e, _ in written]
    assert [float(learning_rate_schedule(exact.train)(c)) for c in range(8)] == pytest.approx(
        [float(learning_rate_schedule(micro_config().train)(c)) for c in range(8)], rel=1e-6)


def test_a_flop_budget_converts_by_the_formula_and_a_wall_clock_one_waits_for_its_speed(tmp_path):
    config = micro_config()
    flops = budget.step_cost(stages.plan(config)[0].config, "flops")
    config.train.budget = f"{10.5 * flops:.17g}flops"
    assert budget.resolve(config)[0].train.num_steps == 10  # rounded down: never past the budget
    timed = micro_config()
    timed.train.budget = "30s"
    unresolved, lines = budget.resolve(timed, str(tmp_path))
    assert unresolved.train.num_steps == 8 and budget.needs_calibration(unresolved)
    assert "measured at the run's first start" in lines[0]
    timed.train.budget_step_s = 0.25  # set (or recorded by the first start): exact
    assert budget.resolve(timed)[0].train.num_steps == 120


def test_a_relaunch_resolves_the_clock_its_first_start_recorded(tmp_path):
    """What makes a resume continue its budget: the same clock from the same config, and for wall-clock time the
    speed the first start measured, read back from DIR/config.json (a new measurement would move every step)."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    config = micro_config()
    config.train.budget, config.train.budget_step_s = "30s", 0.25  # as the calibrating start leaves it
    first, _ = budget.resolve(config)
    (workdir / "config.json").write_text(first.to_json_best_effort())
    relaunched = micro_config()
    relaunched.train.budget = "30s"  # the same command: no speed given, none measured in this process
    again, lines = budget.resolve(relaunched, str(workdir))
    assert (again.train.num_steps, again.train.budget_clock, again.train.budget_step_s) == (
        first.train.num_steps, first.train.budget_clock, 0.25) and "as the run measured at its first start" in lines[0]
    relaunched.train.budget = "40s"  # another budget is another experiment: measured again, then refused on resume
    assert budget.needs_calibration(budget.resolve(relaunched, str(workdir))[0])
    tokens = _token_budget(micro_config(), 12)
    assert budget.resolve(tokens)[0].train.budget_clock == budget.resolve(_token_budget(micro_config(), 12))[
        0].train.budget_clock == ((0, 0, 0.0), (12, 8, 1.0))


@pytest.mark.slow  # two builds of the micro run (~60 s loaded on 2 cores); the clock's resolution is tested above
def test_a_budget_run_stopped_halfway_resumes_its_budget_with_a_continuous_schedule(tmp_path, xla_compile_cache):
    from bert_jax.train.loop import train_and_evaluate  # noqa: PLC0415  (the loop compiles: only this test needs it)

    config = _token_budget(micro_config(), 12)  # 12 steps bought; a save every 4 steps, a stop at 6
    workdir = str(tmp_path / "run")
    train_and_evaluate(config, workdir, stop_at_step=6)
    assert read_done(workdir) is None
    train_and_evaluate(_token_budget(micro_config(), 12), workdir)  # a relaunch: restores the stop's save
    rows = read_metrics(workdir)
    trained = {r["step"]: r for r in rows if "train/loss" in r}
    assert sorted(trained) == list(range(1, 13)) and read_done(workdir)["step"] == 12
    schedule = learning_rate_schedule(budget.resolve(config)[0].train)
    assert [trained[s]["train/learning_rate"] for s in range(1, 13)] == [
        pytest.approx(float(schedule(s - 1))) for s in range(1, 13)]  # the relaunch's steps on the same curve
    assert trained[12]["train/budget_spent"] == 1.0 and trained[6]["train/budget_spent"] == 0.5
    assert any("eval/loss" in r and r["step"] == 12 for r in rows)  # evaluated at the budget's end


def test_plan_says_what_a_token_budget_buys_per_stage():
    config = micro_config()
    config.train.stages = (dict(start=6, data=dict(max_seq_length=32)),)
    written = stages.plan(config)  # what the planner compiles; the CPU compiler has no roofline: no step times
    bought = budget_plan.stage_buys(budget.parse("35840tokens"), written, None)
    # As written: 6 steps of 8 x 64 and 2 of 8 x 32, 3,584 tokens; 35,840 buys ten times each stage's steps.
    assert [(b.steps, b.tokens) for b in bought] == [(60, 30720), (20, 5120)]
    text = budget_plan.format_buys(budget.parse("35840tokens"), bought, "the CPU compiler")
    assert "Steps and tokens are exact" in text and "| all | 1-8 | 80 | 3.584e+04 | | - |" in text
    timed = budget_plan.stage_buys(budget.parse("1h"), written, 0.5)  # stage 0's roofline step time
    text = budget_plan.format_buys(budget.parse("1h"), timed, "1 x h100")
    assert "**An upper bound on steps and tokens**" in text and "collectives" in text
    with pytest.raises(ValueError, match="--budget=8m is wall-clock time: what it buys needs stage 0's roofline"):
        budget_plan.stage_buys(budget.parse("8m"), written, None)


@pytest.mark.parametrize("text", ["1h", "35840tokens", "2e12flops"])
def test_the_plan_and_the_run_resolve_a_budget_to_the_same_steps(text):
    """plan --budget used each stage's roofline time where the run scales stage 0's measured time by FLOPs: a
    staged run's plan promised other steps than the run then trained. One function resolves both now: the plan's
    steps per stage are the run's clock at the speed the plan puts in stage 0."""
    config = micro_config()
    config.train.stages = (dict(start=6, data=dict(max_seq_length=32)),)
    config.train.budget, config.train.budget_step_s = text, 0.5  # the run, had it measured 0.5 s per step of stage 0
    resolved, _ = budget.resolve(config)
    run_steps = [b - a for (a, *_), (b, *_) in zip(resolved.train.budget_clock, resolved.train.budget_clock[1:])]
    bought = budget_plan.stage_buys(budget.parse(text), stages.plan(config), 0.5)
    assert [b.steps for b in bought] == run_steps and sum(run_steps) == resolved.train.num_steps
    costs = budget.stage_costs(stages.plan(config), "seconds", 0.5)
    assert costs[1] < 0.5 and [b.step_s for b in bought] == costs  # stage 1 (half the length): faster by its FLOPs


@pytest.mark.slow  # XLA's GPU compiler (the gpu extra) on a micro model: ~1 minute loaded
def test_plan_for_an_h100_says_what_a_day_buys_per_stage():
    if not gpu_cards.plugin_available():
        pytest.skip("XLA's GPU compiler (the gpu extra) is not installed")
    config = [*micro_overrides(), "--config.train.stages=({'start': 6, 'data': {'max_seq_length': 32}},)"]
    out = subprocess.run([sys.executable, "-m", "bert_jax.commands.plan", "--config=configs/tiny.py", *config,
                          "--gpu=h100", "--num_devices=1", "--budget=24h"], cwd=REPO, capture_output=True, text=True,
                         timeout=900, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "## what --budget=24h buys on 1 x h100" in out.stdout
    assert "**An upper bound on steps and tokens**" in out.stdout
    bought = out.stdout.split("## what --budget=24h buys on 1 x h100")[1]
    rows = [line for line in bought.splitlines() if line.startswith(("| 0 | 1-6 |", "| 1 | 7-8 |", "| all |"))]
    assert len(rows) == 3 and all("| ≤ " in row for row in rows), out.stdout[-2000:]


@pytest.mark.slow  # a wall-clock budget run in a subprocess, SIGKILLed after a save and relaunched: ~2 minutes loaded
def test_a_wall_clock_budget_killed_and_relaunched_trains_the_steps_its_first_start_fixed(tmp_path):
    workdir = tmp_path / "run"
    command = [sys.executable, "-m", "bert_jax.commands.pretrain", "--config=configs/tiny.py", f"--workdir={workdir}",
               *micro_overrides(), "--config.train.budget=20s", "--config.train.budget_calibration_steps=5",
               "--config.train.log_every_steps=5", "--config.train.eval_every_steps=100000",
               "--config.checkpoint.every_steps=10"]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # absl logs to stderr; training begins after this line
        if "starting at step" in line:
            break
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe from filling
    checkpoints = workdir / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not any(
            d.name.isdigit() for d in (checkpoints.iterdir() if checkpoints.exists() else ())):
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before its first save: raise the budget"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    first = json.loads((workdir / "config.json").read_text())["train"]
    assert read_done(str(workdir)) is None and first["budget_step_s"] > 0
    subprocess.run(command, cwd=REPO, check=True, capture_output=True, timeout=900)

    recorded = config_from_json((workdir / "config.json").read_text())
    steps, step_s = recorded.train.num_steps, recorded.train.budget_step_s
    assert (steps, step_s) == (first["num_steps"], first["budget_step_s"])  # the relaunch measured nothing again
    assert steps == int(20 / step_s) and read_done(str(workdir))["step"] == steps  # the budget, spent as defined
    rows = {}
    for row in read_metrics(str(workdir)):  # the newest row of a step (a replayed step's second row)
        rows.setdefault(row["step"], {}).update(row)
    schedule = learning_rate_schedule(recorded.train)
    logged = sorted(s for s, r in rows.items() if "train/learning_rate" in r)
    assert logged[-1] == steps and len(logged) >= steps // 5
    assert [rows[s]["train/learning_rate"] for s in logged] == [pytest.approx(float(schedule(s - 1))) for s in
                                                                  logged]  # no jump at the relaunch
    assert "eval/loss" in rows[steps] and 1 - step_s / 20 < rows[steps]["train/budget_spent"] <= 1  # to a step
    history = [json.loads(line) for line in (workdir / "config_history.jsonl").read_text().splitlines()]
    assert history[0]["event"] == "start" and history[0]["config"]["train"]["budget_step_s"] == step_s


def test_a_budgeted_schedule_past_2_31_steps_runs_on_the_exact_step_counts():
    """A schedule as written of 2e9 steps (linear decay to 0) under a budget of twice its tokens: run step 2s trains
    at the schedule's step s, to the last step past 2^31. A float32 clock rounded run steps to multiples of 256 there,
    and a stretch that is not a whole number placed the schedule up to 128 steps away from the exact step."""
    config = micro_config()
    config.train.num_steps, config.train.end_learning_rate = 2_000_000_000, 0.0
    written = config.copy_and_resolve_references()
    resolved, _ = budget.resolve(_token_budget(config, 2 * config.train.num_steps))
    assert resolved.train.num_steps == 4_000_000_000 > 2**31
    run_lr, written_lr = learning_rate_schedule(resolved.train), learning_rate_schedule(written.train)
    for s in (2_000_000_000, 1_999_999_999, 1_999_999_937, 2**30 + 3, 12_345_677, 3):  # run step 2s, count 2s - 1
        assert counters.schedule_at(run_lr, 2 * s - 1) == pytest.approx(counters.schedule_at(written_lr, s - 1),
                                                                        rel=1e-6), s
    # A stretch that is not a whole number: 1.5x; the schedule's position is exact, its rate linear between steps.
    resolved, _ = budget.resolve(_token_budget(written.copy_and_resolve_references(), 3_000_000_000))
    clock = BudgetClock.of(resolved.train)
    for step in (3_000_000_000, 2_999_999_999, 2**31 + 1, 2**31, 16_777_217, 7):
        whole, fraction = clock.schedule_position(step)
        exact = clock.schedule_step_exact(step)
        assert int(whole) == int(exact) and float(fraction) == pytest.approx(float(exact - int(exact)), abs=1e-6)
    for step in (2_999_999_999, 2**31 + 2):  # count = step - 1; the schedule's step before, interpolated
        position = clock.schedule_step_exact(step) - 1
        low, high = (counters.schedule_at(written_lr, int(position) + i) for i in (0, 1))
        want = low + float(position - int(position)) * (high - low)
        assert counters.schedule_at(learning_rate_schedule(resolved.train), step - 1) == pytest.approx(want, rel=1e-5)
