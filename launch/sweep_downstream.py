"""A sweep's arms judged downstream: `bert-jax sweep evaluate` and the downstream part of `bert-jax sweep summary`.

`evaluate` runs `bert_jax.commands.evaluate` on every arm's final checkpoint, one after another, into
`SWEEP_DIR/downstream/<suite>/<arm>/` (a rerun keeps what is DONE there); with `--executor=ray` (and
`--address`, `--tpu`) each arm's runs are `ray-tpu` jobs on a Ray cluster, as in `sweep run`.
`summary` then gives each arm (row), beside its final loss, columns per suite: each task's median
[min–max] over seeds, the suite average of the medians, and the pre-training tokens seen (`row_columns`,
one of launch/sweep.py's ROW_COLUMNS). Pre-training losses do not compare across objectives, mask rates or
vocabularies; these do. Where two arms' seed ranges overlap on a task, the cell says so (≈, and
`<suite>/overlaps` names the arms) instead of ranking them; ★ marks an arm only where its worst
seed beats every other arm's best; "at chance" where its median is within noise of the task's chance, "learns nothing
3/3" where its runs were diagnosed so (the scoreboard's marks, bert_jax/finetune/scoreboard.py), and `<suite>/tasks_at_chance` counts them. summary.csv holds
each cell's numbers in their own columns (`<suite>/<task>/median`, `/min`, `/max`, `/n`, `/chance`, `/mark`).
"""
import json
import shlex
import subprocess
import sys

from bert_jax import UserError
from bert_jax.finetune import scoreboard
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.run.metrics_file import read_rows
from bert_jax.launch import executors
from bert_jax.launch.summary_cell import Cell


def arms(sweep_dir: str) -> list[str]:
    """The arms (run names) of a sweep directory, as sweep.json records them."""
    record = paths.path(sweep_dir) / "sweep.json"
    if not record.exists():
        raise UserError(f"--sweep_dir={sweep_dir} is not a sweep directory: it holds no sweep.json (`bert-jax sweep "
                        f"run` writes one first)")
    return [run["name"] for run in json.loads(record.read_text())["runs"]]


def out_dir(sweep_dir: str, suite: str, arm: str) -> str:
    return str(paths.path(sweep_dir) / "downstream" / suite_name(suite) / arm)


def suite_name(suite: str) -> str:
    """A suite's folder name: its name, or a suite file's stem."""
    return paths.path(suite).stem if suite.endswith(".py") else suite


def evaluate_commands(sweep_dir: str, suite: str, flags: list[str]) -> list[list[str]]:
    """One `bert_jax.commands.evaluate` command per arm; an arm without a checkpoint fails, naming it, before any runs."""
    commands, missing = [], []
    for arm in arms(sweep_dir):
        workdir = paths.path(sweep_dir) / arm
        if not Workdir(workdir).holds_a_run():
            missing.append(arm)
        commands.append([sys.executable, "-m", "bert_jax.commands.evaluate", f"--checkpoint={workdir}", f"--suite={suite}",
                         f"--out={out_dir(sweep_dir, suite, arm)}", *flags])
    if missing:
        raise UserError(f"--sweep_dir={sweep_dir}: arms {missing} hold no pre-training checkpoint yet; run the sweep "
                        f"first")
    return commands


def evaluate_sweep(args) -> int:
    passed = ["glue_dir", "beir_dir", "tfds_data_dir", "tasks", "seeds", "executor"]
    passed += list(executors.EXECUTORS.get(args.executor).flags)
    flags = [f"--{name}={getattr(args, name)}" for name in passed if getattr(args, name)]
    commands = evaluate_commands(args.sweep_dir, args.suite, flags)
    failed = []
    for i, argv in enumerate(commands):
        print(f"[sweep evaluate] {i + 1}/{len(commands)}: {shlex.join(argv)}", flush=True)
        if subprocess.run(argv).returncode:
            failed.append(argv[3])
    if failed:
        print(f"[sweep evaluate] failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


# --- summary ----------------------------------------------------------------------------------------------------

def _tokens_seen(workdir) -> float | None:
    """The pre-training tokens an arm has seen: the last logged step × its batch × its sequence length (padding
    included), from config.json and metrics.jsonl."""
    run = Workdir(workdir)
    if not run.config_json.exists():
        return None
    rows = read_rows(run.metrics_jsonl)
    seen = [r["train/tokens_seen"] for r in rows if "train/tokens_seen" in r]
    if seen:  # the run's own count, each stage at its batch and length (bert_jax/train/counters.py)
        return float(seen[-1])
    config = json.loads(run.config_json.read_text())  # a run logged before train/tokens_seen: one stage assumed
    batch, length = config.get("train", {}).get("global_batch_size"), config.get("data", {}).get("max_seq_length")
    if not (batch and length):
        return None
    step = max((r["step"] for r in rows), default=0)
    return float(step * batch * length)


def boards(sweep_dir: str, names: list[str]) -> dict[str, dict[str, dict]]:
    """{suite: {arm: scoreboard.json}} of every finished downstream battery under SWEEP_DIR/downstream."""
    root = paths.path(sweep_dir) / "downstream"
    out: dict[str, dict[str, dict]] = {}
    if not root.exists():
        return out
    for suite in sorted(p.name for p in root.iterdir()):
        for arm in names:
            path = root / suite / arm / "scoreboard.json"
            if path.exists():
                out.setdefault(suite, {})[arm] = json.loads(path.read_text())
    return out


def overlaps(rows: dict[str, dict]) -> list[tuple[str, str]]:
    """The pairs of arms whose [min, max] over seeds overlap on a task ({arm: the task's scoreboard row})."""
    names = sorted(rows)
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
            if rows[a]["min"] <= rows[b]["max"] and rows[b]["min"] <= rows[a]["max"]]


def clear_best(rows: dict[str, dict]) -> str | None:
    """The arm whose worst seed beats every other arm's best on a task, if one does."""
    for arm, row in rows.items():
        if len(rows) > 1 and all(row["min"] > other["max"] for a, other in rows.items() if a != arm):
            return arm
    return None


def row_columns(workdir, run: dict) -> dict:
    """launch.sweep summary's downstream columns of one arm (launch.sweep's ROW_COLUMNS): per suite evaluated,
    `<suite>/<task>` = "median [min–max]" (× 100) with ★ where this arm's worst seed beats every other arm's best
    or ≈ where its range overlaps another's (not ranked), `<suite>/average` of the medians, `<suite>/overlaps`
    naming the arms it overlaps on each task; and `pretrain/tokens_seen`. Every arm gets the same columns (— where
    it has no scoreboard); a sweep never evaluated gets none."""
    workdir = paths.path(workdir)
    sweep_dir, arm = workdir.parent, workdir.name
    by_suite = boards(str(sweep_dir), arms(str(sweep_dir)))
    if not by_suite:
        return {}
    out = {"pretrain/tokens_seen": _tokens_seen(workdir)}
    for suite, by_arm in by_suite.items():
        tasks = list(dict.fromkeys(t for board in by_arm.values() for t in board["tasks"]))
        mine = by_arm.get(arm)
        notes = []
        for t in tasks:
            rows = {a: b["tasks"][t] for a, b in by_arm.items() if t in b["tasks"]}
            row = rows.get(arm)
            if row is None:
                out[f"{suite}/{t}"] = None
                continue
            others = sorted({b for pair in overlaps(rows) if arm in pair for b in pair if b != arm})
            marks = ["★" if clear_best(rows) == arm else "≈" if others else "", scoreboard.chance_mark(row)]
            mark = " ".join(m for m in marks if m)
            spread = "zero-shot" if row.get("zero_shot") else f"[{100 * row['min']:.1f}–{100 * row['max']:.1f}]"
            text = f"{100 * row['median']:.1f} {spread}"  # a zero-shot retrieval dataset has one run, no seeds
            out[f"{suite}/{t}"] = Cell(text + (f" {mark}" if mark else ""), {
                "median": row["median"], "min": row["min"], "max": row["max"], "n": row["n"],
                "chance": row.get("chance"), "mark": mark or None})
            if others:
                notes.append(f"{t} ≈ {', '.join(others)}")
        average = None if mine is None else mine.get("average")
        out[f"{suite}/average"] = None if average is None else round(100 * average, 2)
        out[f"{suite}/tasks_at_chance"] = None if mine is None else mine.get("tasks_at_chance")
        out[f"{suite}/overlaps"] = "; ".join(notes) if notes else None
    return out
