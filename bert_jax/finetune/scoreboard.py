"""A battery's results -> the scoreboard: per task the median over seeds, its min–max and n, the best learning rate
of a grid, and the suite's average of the medians; as OUT/scoreboard.json, .csv, .md and a per-seed plot (.png).

The median, not the mean: the small tasks (RTE, MRPC, CoLA) swing by points from seed to
seed, and one diverged seed would drag a mean (ELECTRA's README and MosaicBERT report medians).
A grid's learning rate is the one with the best median over seeds; its seeds are the task's row.

Each row carries its task's chance: the score of the constant predictor its training rows suggest (the majority
class, the mean; bert_jax.finetune.tasks' `chance`), as the runs record it, and the margin within which a score is
luck (metrics.chance_margin, on the dev set's size). A median within it is marked "at chance", and the average says
how many of its tasks are: an average over tasks a model did not learn is not a score of the model.

Each row carries its runs' own verdicts too (bert_jax/finetune/diagnosis.py, in each results.json): a row whose seeds
were diagnosed "learns nothing" or "chaotic" says so and how many ("learns nothing 3/3"), whatever its median, and
the average counts the tasks most of whose runs learned nothing. The board never reads cleaner than its runs: a
median a little above a chance margin, from runs that each learned nothing, is not a score either.

A checkpoint that is a branch or an averaged run (bert_jax/run/lineage.py) says where it came from, under the title:
arms that share a stable phase are read as such.
"""
import csv
import io
import json

import numpy as np

from bert_jax.checkpoint import reference
from bert_jax.finetune import diagnosis
from bert_jax.finetune import metrics as metrics_lib
from bert_jax.run import lineage
from bert_jax.storage import paths

FILES = ("scoreboard.json", "scoreboard.csv", "scoreboard.md", "scoreboard.png")
# The verdicts a row shows: its runs did not learn, or their scores are noise.
MARKED_VERDICTS = (diagnosis.LEARNS_NOTHING, diagnosis.CHAOTIC)


def scores_by_lr(metric: str, runs: dict) -> dict[float, dict[int, float]]:
    """{learning rate: {seed: the run's validation `metric`}} of one task's runs ({Run: results.json})."""
    out: dict[float, dict[int, float]] = {}
    for run, result in sorted(runs.items(), key=lambda kv: (kv[0].learning_rate, kv[0].seed)):
        out.setdefault(run.learning_rate, {})[run.seed] = float(result["validation"][metric])
    return out


def best_learning_rate(metric: str, runs: dict) -> float:
    """The learning rate whose seeds have the best median (the smaller rate on a tie)."""
    by_lr = scores_by_lr(metric, runs)
    return max(sorted(by_lr), key=lambda lr: (float(np.median(list(by_lr[lr].values()))), -lr))


def build(record: dict, metrics: dict[str, str], results: dict) -> dict:
    """The scoreboard of a battery: `record` is OUT/battery.json's, `metrics` each task's headline, `results`
    {Run: results.json} of every run."""
    tasks = {}
    for name in record["tasks"]:
        runs = {r: v for r, v in results.items() if r.task == name}
        metric = metrics[name]
        by_lr = scores_by_lr(metric, runs)
        best = best_learning_rate(metric, runs)
        scores = by_lr[best]
        values = np.array(list(scores.values()))
        tasks[name] = {"metric": metric, "median": float(np.median(values)), "min": float(values.min()),
                       "max": float(values.max()), "n": len(values),
                       "best_lr": best if len(by_lr) > 1 else None, "learning_rate": best,
                       "scores": {str(seed): v for seed, v in scores.items()},
                       "median_by_lr": {f"{lr:g}": float(np.median(list(s.values()))) for lr, s in by_lr.items()}}
        tasks[name].update(chance_of(metric, tasks[name]["median"], runs))
        tasks[name]["verdicts"] = verdicts_of({r: v for r, v in runs.items() if r.learning_rate == best})
    average = float(np.mean([t["median"] for t in tasks.values()])) if tasks else None
    return {"checkpoint": record["checkpoint"], "suite": record["suite"], "seeds": record["seeds"],
            "tasks": tasks, "average": average, "tasks_at_chance": sum(bool(t["at_chance"]) for t in tasks.values()),
            "tasks_learning_nothing": sum(learns_nothing(t) for t in tasks.values()),
            **provenance(record["checkpoint"])}


def verdicts_of(runs: dict) -> dict[str, int]:
    """{verdict: how many of the row's runs got it} from their results.json's diagnosis; {} where none recorded one."""
    names = [r["diagnosis"]["name"] for r in runs.values() if r.get("diagnosis")]
    return {name: names.count(name) for name in dict.fromkeys(names)}


def learns_nothing(t: dict) -> bool:
    """Whether most of a row's runs were diagnosed "learns nothing"."""
    verdicts = t.get("verdicts") or {}
    return 2 * verdicts.get(diagnosis.LEARNS_NOTHING, 0) > t["n"]


def provenance(checkpoint: str) -> dict:
    """{"lineage": "runs/stable@100 > runs/decay:400"} of a checkpoint that is a branch, {"averaged_from": ...} of an
    averaged run; {} for any other (an HF folder, a run that started from scratch)."""
    return lineage.provenance(reference.split(checkpoint)[0], checkpoint)


def chance_of(metric: str, median: float, runs: dict) -> dict:
    """A task's chance (its runs' results.json record it; None where they do not), its margin, and whether
    `median` is within it."""
    recorded = next((r["chance"] for r in runs.values() if metric in r.get("chance", {}).get("validation", {})), None)
    if recorded is None:
        return {"chance": None, "chance_margin": None, "at_chance": None}
    chance, margin = recorded["validation"][metric], metrics_lib.chance_margin(metric, recorded["examples"])
    return {"chance": chance, "chance_margin": margin, "at_chance": metrics_lib.at_chance(median, chance, margin)}


def chance_mark(t: dict) -> str:
    """A task row's marks: "at chance" for a median within its margin of chance, and each verdict of
    MARKED_VERDICTS its runs got, with how many ("learns nothing 3/3"); "" for a row that learned."""
    marks = ["at chance"] if t.get("at_chance") else []
    verdicts = t.get("verdicts") or {}
    marks += [f"{name} {verdicts[name]}/{t['n']}" for name in MARKED_VERDICTS if verdicts.get(name)]
    return "; ".join(marks)


def average_note(board: dict) -> str:
    """What the average of the medians stands on: "" when every task learned, else how many are at chance and how
    many learned nothing by their runs' own diagnosis."""
    total = len(board["tasks"])
    notes = [f"{n} of {total} tasks {what}" for n, what in (
        (board.get("tasks_at_chance") or 0, "at chance"),
        (board.get("tasks_learning_nothing") or 0, "learn nothing (most of their runs' diagnosis)")) if n]
    return "; ".join(notes)


def markdown(board: dict) -> str:
    """The table: per task its metric, median, min–max and n (scores × 100), the best learning rate of a grid, its
    chance ± margin and the mark of a median at chance."""
    lines = [f"Suite `{board['suite']}` on `{board['checkpoint']}`: median over seeds (× 100) on dev.", "",
             "| task | metric | median | min–max | n | best lr | chance | |", "|---|---|---|---|---|---|---|---|"]
    where = [f"{what}: {board[key]}" for key, what in (("lineage", "Lineage"), ("averaged_from", "Averaged from"))
             if board.get(key)]
    lines[1:1] = ["", "; ".join(where)] if where else []
    for name, t in board["tasks"].items():
        lr = f"{t['best_lr']:g}" if t["best_lr"] is not None else "—"
        chance = "—" if t.get("chance") is None else f"{100 * t['chance']:.1f} ± {100 * t['chance_margin']:.1f}"
        lines.append(f"| {name} | {t['metric']} | {100 * t['median']:.1f} | {100 * t['min']:.1f}–{100 * t['max']:.1f} "
                     f"| {t['n']} | {lr} | {chance} | {chance_mark(t)} |")
    if board["average"] is not None:
        lines.append(f"| **average** | of the medians | **{100 * board['average']:.1f}** | | | | | "
                     f"{average_note(board)} |")
    return "\n".join(lines) + "\n"


def csv_text(board: dict) -> str:
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(["task", "metric", "median", "min", "max", "n", "best_lr", "scores", "verdicts", "chance",
                     "chance_margin", "at_chance"])
    blank = lambda v: "" if v is None else v  # noqa: E731
    for name, t in board["tasks"].items():
        writer.writerow([name, t["metric"], t["median"], t["min"], t["max"], t["n"], blank(t["best_lr"]),
                         " ".join(f"{v:.6g}" for v in t["scores"].values()),
                         "; ".join(f"{k}={v}" for k, v in (t.get("verdicts") or {}).items()), blank(t.get("chance")),
                         blank(t.get("chance_margin")), blank(t.get("at_chance"))])
    writer.writerow(["average", "", board["average"], "", "", "", "", "", "", "", "", board.get("tasks_at_chance", "")])
    return out.getvalue()


def plot_png(board: dict) -> bytes:
    """Each task's per-seed scores as dots, its median as a bar."""
    import matplotlib  # noqa: PLC0415 (only drawing needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    names = list(board["tasks"])
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(names) + 2), 3.5))
    for i, name in enumerate(names):
        t = board["tasks"][name]
        values = [100 * v for v in t["scores"].values()]
        ax.scatter([i] * len(values), values, color="tab:blue", alpha=0.7, zorder=3)
        ax.hlines(100 * t["median"], i - 0.3, i + 0.3, color="tab:red", zorder=4)
        if t.get("chance") is not None:
            ax.hlines(100 * t["chance"], i - 0.4, i + 0.4, color="grey", linestyles="dashed", zorder=2)
    ax.set_xticks(range(len(names)), [f"{n}\n({board['tasks'][n]['metric']})" for n in names], fontsize=8)
    ax.set_ylabel("dev score × 100")
    ax.set_title(f"{board['suite']}: per-seed scores (dots), median (bar), chance (dashed)", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    return png.getvalue()


def write(out: str, board: dict) -> None:
    """OUT/scoreboard.{json,csv,md,png}, each written whole (atomically)."""
    root = paths.path(out)
    paths.write_atomically(root / "scoreboard.json", json.dumps(board, indent=2))
    paths.write_atomically(root / "scoreboard.csv", csv_text(board))
    paths.write_atomically(root / "scoreboard.md", markdown(board))
    paths.write_atomically(root / "scoreboard.png", plot_png(board))


def read(out: str) -> dict | None:
    """OUT/scoreboard.json, or None when the battery has not finished."""
    path = paths.path(out) / "scoreboard.json"
    return json.loads(path.read_text()) if path.exists() else None
