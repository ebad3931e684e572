"""A run's lineage (bert_jax/run/lineage.py): what a branch records of its ancestors, and where the readers of runs
show it (wandb's group, `sweep summary`, the scoreboard, `inspect`). The config.json files are written by hand: no
branch is trained here."""
import json

import ml_collections
import pytest

from bert_jax import UserError
from bert_jax.finetune import scoreboard
from bert_jax.launch import sweep
from bert_jax.run import lineage
from bert_jax.run.metrics_writer import wandb_init_args
from conftest import with_changes

CONFIG = {"seed": 0, "model": {"family": "bert", "hidden_size": 32}, "data": {"mask_rate": 0.15, "path": "a"},
          "train": {"learning_rate": 1e-3, "log_every_steps": 10},
          "logging": {"wandb_mode": "disabled", "wandb_run_name": "", "wandb_group": "", "wandb_project": "p"},
          "checkpoint": {"every_steps": 100}, "run_identity": {"tokenizer_sha256": "f" * 64}}


def _run(path, config=None, **top) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**(config or CONFIG), **top}, indent=2))
    return str(path)


def _with(**dotted) -> dict:
    return with_changes(json.loads(json.dumps(CONFIG)), **dotted)


def test_the_digest_ignores_what_a_passing_resume_changes_and_follows_the_experiment(tmp_path):
    base = lineage.config_digest(_run(tmp_path / "a"))
    assert len(base) == 12 and int(base, 16) >= 0
    passing = _with(train__log_every_steps=1, data__path="b", logging__wandb_mode="offline",
                    checkpoint__every_steps=5, run_identity={"tokenizer_sha256": "0" * 64})
    assert lineage.config_digest(_run(tmp_path / "b", passing)) == base
    assert lineage.config_digest(_run(tmp_path / "c", lineage=[{"workdir": "x", "step": 1, "config_digest": "d"}],
                                      averaged_from=[])) == base  # where a run came from is not its experiment
    for changed in (_with(train__learning_rate=2e-3), _with(data__mask_rate=0.3), _with(seed=1)):
        assert lineage.config_digest(_run(tmp_path / "d", changed)) != base
    assert lineage.digest(dict(reversed(CONFIG.items()))) == base  # the order of keys in the file does not count


def test_a_branch_of_a_branch_names_every_ancestor_root_first(tmp_path):
    stable = _run(tmp_path / "stable")
    ctx = _run(tmp_path / "ctx", _with(data__mask_rate=0.3), lineage=lineage.of_branch(stable, 100))
    decay = _run(tmp_path / "decay", lineage=lineage.of_branch(ctx, 300))
    recorded = lineage.read(decay)
    assert recorded == [
        {"workdir": stable, "step": 100, "config_digest": lineage.config_digest(stable)},
        {"workdir": ctx, "step": 300, "config_digest": lineage.config_digest(ctx)},
    ]
    assert recorded[0]["config_digest"] != recorded[1]["config_digest"]
    assert lineage.root(decay) == lineage.root(ctx) == lineage.root(stable) == stable
    assert lineage.read(stable) == [] and lineage.read(str(tmp_path / "nowhere")) == []
    assert lineage.describe(recorded, decay) == f"{stable}@100 > {ctx}@300 > {decay}"
    assert lineage.describe([], stable) == stable


def test_a_branch_of_a_folder_without_a_config_is_refused_naming_it(tmp_path):
    with pytest.raises(UserError, match="nowhere/config.json does not exist"):
        lineage.of_branch(str(tmp_path / "nowhere"), 1)


def _logging(group: str = "", name: str = "") -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({"logging": {"wandb_project": "p", "wandb_run_name": name, "wandb_group": group,
                                                  "wandb_mode": "offline"}})


def test_wandb_groups_a_branch_with_its_root_run_and_a_sweeps_group_wins(tmp_path):
    stable = _run(tmp_path / "stable")
    decay = _run(tmp_path / "decay", lineage=lineage.of_branch(_run(tmp_path / "ctx", lineage=lineage.of_branch(
        stable, 100)), 300))
    args = wandb_init_args(_logging(), decay, str(tmp_path / "staging"))
    assert (args["group"], args["name"]) == ("stable", "decay")
    assert wandb_init_args(_logging(group="sweep_a"), decay, "s")["group"] == "sweep_a"
    assert wandb_init_args(_logging(), stable, "s")["group"] is None  # a run that is no branch: as before
    named = _run(tmp_path / "named_root", _with(logging__wandb_run_name="wsd-stable"))
    branch = _run(tmp_path / "b", lineage=lineage.of_branch(named, 7))
    assert wandb_init_args(_logging(), branch, "s")["group"] == "wsd-stable"  # the root's own wandb name


def _metrics(workdir: str) -> None:
    with open(f"{workdir}/metrics.jsonl", "w") as f:
        f.write(json.dumps({"step": 10, "train/loss": 7.0, "eval/loss": 7.0}) + "\n")


def test_sweep_summary_shows_a_branchs_lineage(tmp_path):
    stable = _run(tmp_path / "stable")
    for name, top in (("decay=linear", {"lineage": lineage.of_branch(stable, 100)}), ("scratch", {})):
        _metrics(_run(tmp_path / "sweep" / name, **top))
    (tmp_path / "sweep" / "sweep.json").write_text(json.dumps({"runs": [{"name": "decay=linear"},
                                                                        {"name": "scratch"}]}))
    table = sweep.summarize(str(tmp_path / "sweep"))
    assert [row["lineage"] for row in table] == [f"{stable}@100 > decay=linear", None]
    summary_md = (tmp_path / "sweep" / "summary.md").read_text()
    assert summary_md.startswith("| run | state | step | objective | lineage |")
    objective = table[0]["objective"]
    assert f"| decay=linear | running | 10 | {objective} | {stable}@100 > decay=linear | 7 (7) |" in summary_md
    assert f"| scratch | running | 10 | {table[1]['objective']} | — | 7 (7) |" in summary_md
    assert "lineage" in (tmp_path / "sweep" / "summary.csv").read_text().splitlines()[0]


def test_sweep_summary_of_runs_without_lineage_has_no_lineage_column(tmp_path):
    _metrics(_run(tmp_path / "plain" / "scratch"))
    (tmp_path / "plain" / "sweep.json").write_text(json.dumps({"runs": [{"name": "scratch"}]}))
    sweep.summarize(str(tmp_path / "plain"))
    assert "lineage" not in (tmp_path / "plain" / "summary.md").read_text()
    assert "lineage" not in (tmp_path / "plain" / "summary.csv").read_text()


def _board(checkpoint: str) -> dict:
    record = {"checkpoint": checkpoint, "suite": "smoke", "seeds": [0], "tasks": []}
    return scoreboard.build(record, {}, {})


def test_the_scoreboard_says_where_a_branch_or_an_averaged_checkpoint_came_from(tmp_path):
    stable = _run(tmp_path / "stable")
    decay = _run(tmp_path / "decay", lineage=lineage.of_branch(stable, 100))
    board = _board(f"{decay}:400")
    assert board["lineage"] == f"{stable}@100 > {decay}:400"
    assert f"\n\nLineage: {stable}@100 > {decay}:400\n\n| task |" in scoreboard.markdown(board)
    merged = _run(tmp_path / "merged", averaged_from=[{"workdir": decay, "step": 400, "ema": False, "weight": 0.5},
                                                      {"workdir": stable, "step": 300, "ema": True, "weight": 0.5}])
    board = _board(merged)
    assert board["averaged_from"] == f"{decay}@400 ×0.5 + {stable}@300:ema ×0.5" and "lineage" not in board
    assert "Averaged from: " in scoreboard.markdown(board)
    plain = _board(stable)
    assert "lineage" not in plain and "averaged_from" not in plain
    assert scoreboard.markdown(plain).startswith(f"Suite `smoke` on `{stable}`: median over seeds (× 100) on dev.\n\n"
                                                 "| task |")  # as before: no line for a run from scratch


def test_inspect_prints_a_workdirs_lineage_and_sources(tmp_path):
    from bert_jax.inspect import views  # noqa: PLC0415 (loads jax and the model zoo: this test only)

    stable = _run(tmp_path / "stable")
    decay = _run(tmp_path / "decay", lineage=lineage.of_branch(stable, 100),
                 averaged_from=[{"workdir": stable, "step": 100, "ema": False, "weight": 1.0}])
    assert views.provenance(f"{decay}:last") == [f"lineage: {stable}@100 > {decay}",
                                                 f"averaged from: {stable}@100 ×1"]
    assert views.provenance(stable) == [] and views.provenance(str(tmp_path / "hf_folder")) == []
