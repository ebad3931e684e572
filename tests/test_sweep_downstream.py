"""Sweep arms judged downstream: `bert-jax sweep evaluate` runs `bert-jax evaluate` per arm; `bert-jax sweep summary` adds
arms × tasks (median [min–max]), the suite average, tokens seen and final loss, and says where arms' seed ranges
overlap instead of ranking them."""
import csv
import io
import json
import os
import subprocess
import sys

import pytest

from bert_jax.finetune import scoreboard
from bert_jax.finetune.battery import Run
from bert_jax.commands import sweep as sweep_command
from bert_jax.launch import sweep, sweep_downstream

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def made_board(arm: str, scores: dict[str, tuple]) -> dict:
    runs = {Run(task, 1e-4, seed, ""): {"validation": {metric: v}}
            for task, (metric, values) in scores.items() for seed, v in enumerate(values)}
    record = {"checkpoint": arm, "suite": "smoke", "seeds": [0, 1, 2], "tasks": list(scores)}
    return scoreboard.build(record, {t: m for t, (m, _) in scores.items()}, runs)


def made_sweep(root, boards: dict[str, dict]) -> None:
    (root / "sweep.json").write_text(json.dumps({"runs": [{"name": arm, "point": {}} for arm in boards]}))
    for i, (arm, board) in enumerate(boards.items()):
        (root / arm).mkdir()
        (root / arm / "config.json").write_text(json.dumps({"train": {"global_batch_size": 8},
                                                            "data": {"max_seq_length": 64, "tokenizer": {}}}))
        (root / arm / "metrics.jsonl").write_text(json.dumps({"step": 100, "train/loss": 3.0 + i}) + "\n")
        out = root / "downstream" / "smoke" / arm
        out.mkdir(parents=True)
        (out / "scoreboard.json").write_text(json.dumps(board))


def test_summary_gives_each_arm_its_downstream_scores_and_says_where_seed_ranges_overlap(tmp_path):
    made_sweep(tmp_path, {
        "mask_rate=0.15": made_board("a", {"sst2": ("accuracy", (0.80, 0.84, 0.82)),
                                           "stsb": ("spearman", (0.60, 0.62, 0.61))}),
        "mask_rate=0.3": made_board("b", {"sst2": ("accuracy", (0.83, 0.86, 0.85)),
                                          "stsb": ("spearman", (0.40, 0.45, 0.50))}),
    })
    table = {row["run"]: row for row in sweep.summarize(str(tmp_path))}
    # stsb: every seed of 0.15 above every seed of 0.3 -> ranked (★); sst2: the ranges overlap -> ≈, not ranked.
    low, high = table["mask_rate=0.15"], table["mask_rate=0.3"]
    assert (low["smoke/sst2"], low["smoke/stsb"]) == ("82.0 [80.0–84.0] ≈", "61.0 [60.0–62.0] ★")
    assert (high["smoke/sst2"], high["smoke/stsb"]) == ("85.0 [83.0–86.0] ≈", "45.0 [40.0–50.0]")
    assert (low["smoke/average"], high["smoke/average"]) == (71.5, 65.0)
    assert (low["smoke/overlaps"], high["smoke/overlaps"]) == ("sst2 ≈ mask_rate=0.3", "sst2 ≈ mask_rate=0.15")
    assert low["pretrain/tokens_seen"] == 100 * 8 * 64 and (low["train/loss"], high["train/loss"]) == (3.0, 4.0)
    md = (tmp_path / "summary.md").read_text()
    assert "smoke/sst2 | smoke/stsb | smoke/average | smoke/tasks_at_chance | smoke/overlaps" in md
    assert "| 82.0 [80.0–84.0] ≈ | 61.0 [60.0–62.0] ★ | 71.5 | 0 | sst2 ≈ mask_rate=0.3 |" in md
    assert "~" not in md  # one overlap mark
    # summary.csv: numbers, each in its own column, not "82.0 [80.0–84.0] ≈".
    rows = {r["run"]: r for r in csv.DictReader(io.StringIO((tmp_path / "summary.csv").read_text()))}
    cells = {k: rows["mask_rate=0.15"][f"smoke/sst2/{k}"] for k in ("median", "min", "max", "n", "mark")}
    assert cells == {"median": "0.82", "min": "0.8", "max": "0.84", "n": "3", "mark": "≈"}
    assert "smoke/sst2" not in rows["mask_rate=0.15"]


def test_a_task_at_chance_is_marked_in_the_summary_and_counted(tmp_path):
    chance = {"validation": {"accuracy": 0.5}, "examples": 400}  # a margin of 0.05
    boards = {}
    for arm, values in (("a", (0.50, 0.52, 0.51)), ("b", (0.80, 0.84, 0.82))):
        runs = {Run("sst2", 1e-4, seed, ""): {"validation": {"accuracy": v}, "chance": chance}
                for seed, v in enumerate(values)}
        boards[arm] = scoreboard.build({"checkpoint": arm, "suite": "smoke", "seeds": [0, 1, 2], "tasks": ["sst2"]},
                                       {"sst2": "accuracy"}, runs)
    made_sweep(tmp_path, boards)
    table = {row["run"]: row for row in sweep.summarize(str(tmp_path))}
    assert (table["a"]["smoke/sst2"], table["b"]["smoke/sst2"]) == ("51.0 [50.0–52.0] at chance",
                                                                    "82.0 [80.0–84.0] ★")
    assert (table["a"]["smoke/tasks_at_chance"], table["b"]["smoke/tasks_at_chance"]) == (1, 0)


def test_losses_of_arms_that_differ_in_mask_rate_are_marked_not_comparable_with_the_reason(tmp_path):
    made_sweep(tmp_path, {"mask_rate=0.15": made_board("a", {}), "mask_rate=0.3": made_board("b", {})})
    for arm, rate in (("mask_rate=0.15", 0.15), ("mask_rate=0.3", 0.3)):
        config = json.loads((tmp_path / arm / "config.json").read_text())
        config["data"]["mask_rate"] = rate
        (tmp_path / arm / "config.json").write_text(json.dumps(config))
    table = sweep.summarize(str(tmp_path))
    assert [(r["loss_comparable"], r["loss_differs_in"]) for r in table] == [
        (False, "mask rate 0.15: mask_rate=0.15; 0.3: mask_rate=0.3")] * 2
    md = (tmp_path / "summary.md").read_text()
    assert "train/loss (best) †" in md and "perf/tokens_per_s (best) |" in md  # throughput still compares
    assert ("† not comparable across these arms, which differ in mask rate 0.15: mask_rate=0.15; "
            "0.3: mask_rate=0.3") in md
    assert "train/masked_fraction (best)" in md
    same = tmp_path / "same"
    same.mkdir()
    made_sweep(same, {"lr=1": made_board("a", {}), "lr=2": made_board("b", {})})
    assert all(r["loss_comparable"] for r in sweep.summarize(str(same)))
    assert "†" not in (same / "summary.md").read_text()


def test_a_sweep_never_evaluated_gets_no_downstream_columns(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": [{"name": "a", "point": {}}]}))
    (tmp_path / "a").mkdir()
    assert sweep_downstream.row_columns(tmp_path / "a", {"name": "a"}) == {}


def test_a_sweep_without_checkpoints_is_refused_naming_the_arms(tmp_path):
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": [{"name": "a"}, {"name": "b"}]}))
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match=r"arms \['a', 'b'\] hold no pre-training checkpoint"):
        sweep_downstream.evaluate_commands(str(tmp_path), "smoke", [])
    with pytest.raises(ValueError, match="is not a sweep directory"):
        sweep_downstream.evaluate_commands(str(tmp_path / "b"), "smoke", [])


@pytest.mark.parametrize("argv", [["summary", "--sweep_dir={missing}"], ["evaluate", "--sweep_dir={missing}"],
                                  ["evaluate", "{missing}", "--suite=smoke"], ["summary", "--sweep_dir={empty}"]])
def test_summary_and_evaluate_refuse_a_directory_that_is_not_a_sweep_in_one_line(tmp_path, capsys, argv):
    (tmp_path / "empty").mkdir()
    argv = [a.format(missing=tmp_path / "missing", empty=tmp_path / "empty") for a in argv]
    with pytest.raises(SystemExit) as exit_:
        sweep_command.main(argv)
    refusal = capsys.readouterr().err.splitlines()
    assert exit_.value.code == 2 and len(refusal) == 1, refusal
    named = tmp_path / ("empty" if "empty" in argv[1] else "missing")
    assert refusal[0].startswith("bert-jax sweep: ") and f"--sweep_dir={named}" in refusal[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]  # nothing made


def test_evaluate_takes_the_sweep_directory_as_a_flag_or_positionally_but_not_two_of_them(tmp_path, capsys):
    for argv in (["evaluate", f"--sweep_dir={tmp_path}", str(tmp_path / "other")], ["evaluate", "--suite=smoke"]):
        with pytest.raises(SystemExit) as exit_:
            sweep_command.main(argv)
        refusal = capsys.readouterr().err.splitlines()
        assert exit_.value.code == 2 and "--sweep_dir" in refusal[0] and len(refusal) == 2  # and where --help is


@pytest.mark.slow  # a tokenizer, two pre-training runs and two batteries, in subprocesses
def test_a_two_arm_mask_rate_sweep_is_evaluated_and_summarised_downstream(tmp_path):
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from test_evaluate import write_glue
    from test_pretrain import micro_config

    base = micro_config()
    overrides = {"model.vocab_size": base.model.vocab_size, "model.hidden_size": 32, "model.num_heads": 2,
                 "model.intermediate_size": 64, "data.max_seq_length": 64, "data.max_predictions_per_seq": 20,  # 30 % of 64
                 "data.num_eval_batches": 1, "train.global_batch_size": 8, "train.num_steps": 4,
                 "train.warmup_steps": 1, "train.log_every_steps": 2, "train.eval_every_steps": 4,
                 "checkpoint.every_steps": 4, "logging.peak_flops_per_device": 1e11, "logging.tensorboard": False}
    sweep_file = tmp_path / "mask_rate.py"
    sweep_file.write_text("def get_sweep():\n"
                          f"    return dict(config='configs/tiny.py', overrides={overrides!r},\n"
                          "                grid={'data.mask_rate': [0.15, 0.3]})\n")
    sweep_dir, glue = tmp_path / "sweep", write_glue(tmp_path / "glue", 128, 32)
    for argv in (["run", f"--sweep={sweep_file}", f"--sweep_dir={sweep_dir}"],
                 ["evaluate", f"--sweep_dir={sweep_dir}", "--suite=smoke", f"--glue_dir={glue}", "--tasks=sst2", "--seeds=2"],
                 ["summary", f"--sweep_dir={sweep_dir}"]):
        done = subprocess.run([sys.executable, "-m", "bert_jax.commands.sweep", *argv], cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    print(done.stdout)
    assert "smoke/sst2 | smoke/average | smoke/tasks_at_chance | smoke/overlaps" in done.stdout
    assert "† not comparable across these arms, which differ in mask rate" in done.stdout
    for arm in ("mask_rate=0.15", "mask_rate=0.3"):
        board = json.loads((sweep_dir / "downstream" / "smoke" / arm / "scoreboard.json").read_text())
        assert board["tasks"]["sst2"]["n"] == 2
        t = board["tasks"]["sst2"]
        assert f"{100 * t['median']:.1f} [{100 * t['min']:.1f}–{100 * t['max']:.1f}]" in done.stdout


def test_summary_puts_fine_tuned_and_zero_shot_retrieval_tasks_side_by_side(tmp_path):
    """A suite mixing kinds (configs/suites/embeddings.py): STS-B over seeds as before, a retrieval dataset as its one
    zero-shot nDCG@10 (bert_jax/finetune/zero_shot.py's row), ranked only where one arm's value beats the other's."""
    from bert_jax.finetune import zero_shot

    boards = {}
    for arm, sts, ndcg in (("a", (0.60, 0.62, 0.61), 0.31), ("b", (0.40, 0.45, 0.50), 0.35)):
        board = made_board(arm, {"stsb": ("spearman", sts)})
        board["tasks"].update(zero_shot.board_rows({"scifact": {"ndcg@10": ndcg, "recall@100": 0.9, "mrr@10": 0.3}}))
        boards[arm] = board
    made_sweep(tmp_path, boards)
    table = {row["run"]: row for row in sweep.summarize(str(tmp_path))}
    assert (table["a"]["smoke/stsb"], table["a"]["smoke/scifact"]) == ("61.0 [60.0–62.0] ★", "31.0 zero-shot")
    assert (table["b"]["smoke/stsb"], table["b"]["smoke/scifact"]) == ("45.0 [40.0–50.0]", "35.0 zero-shot ★")
