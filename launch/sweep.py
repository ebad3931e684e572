"""Sweeps: a base config and a grid (or list) of overrides -> one pre-training run per point.

    python -m launch.sweep run --sweep=configs/sweeps/tiny_lr.py --sweep_dir=runs/tiny_lr
    python -m launch.sweep summary --sweep_dir=runs/tiny_lr
    python -m launch.sweep evaluate runs/tiny_lr --suite=glue --glue_dir=/data/glue   (launch/sweep_downstream.py)

A sweep file is Python with `get_sweep()` returning a dict:
    config     the base config file, e.g. "configs/tiny.py"
    overrides  {key: value} applied to every point (optional)
    grid       {key: [values]}: every combination is a point (optional)
    points     [{key: value}]: explicit points, added after the grid (optional)
    command    the module each point runs (optional): "bert_jax.pretrain" (default) or
               "bert_jax.finetune", e.g. a grid of train.learning_rate x train.epochs x seed
               over configs/finetune/classification.py
    summary_keys  the metrics summary.md lists (optional; default SUMMARY_KEYS)
Keys are config paths without the `config.` prefix ("train.learning_rate"). Each run's
workdir is `<sweep_dir>/<name>`, the name built from the point's own overrides
("learning_rate=0.001"), and `<sweep_dir>/sweep.json` records name -> overrides.
`--executor=local` runs the points one after another here; `--executor=tpu` prints
one `launch.tpu_vm all` command per point. `summary` writes summary.md, summary.csv
and curves.png (train loss and eval loss of every run) into the sweep directory; when the
grid varies `seed`, summary.md also gives each metric's mean ± std over the seeds of every
other point (small-data fine-tuning is unstable: the spread is the result).

Points share their tokenizer. Points whose data and tokenizer settings are equal
(tokenizer_training.training_settings) get one, trained once into
`<sweep_dir>/tokenizers/<kind>-<hash of the settings>` before any point starts, and passed
to each as `data.tokenizer.path`: otherwise every point would train its own, and a
learning-rate sweep would also sweep the vocabulary (points may run at once on different
hosts, so they cannot train it lazily). A point that changes a tokenizer setting (its kind,
vocab_size, the data...) gets its own. Points that do not train one (a given
`data.tokenizer.path`, prepared shards, `init_from_hf`) keep theirs. summary.md names the
tokenizer (its sha256) each run used.
"""
import argparse
import csv
import hashlib
import importlib.util
import itertools
import io
import json
import re
import shlex
import subprocess
import sys

from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.train.metrics_file import read_rows
from launch import sweep_downstream

SUMMARY_KEYS = ("train/loss", "train/mlm_accuracy", "eval/loss", "eval/mlm_accuracy", "perf/tokens_per_s")
PRETRAIN = "bert_jax.pretrain"
COMMANDS = (PRETRAIN, "bert_jax.finetune")


def load_sweep(path: str) -> dict:
    spec = importlib.util.spec_from_file_location("sweep_file", path)
    if spec is None:
        raise FileNotFoundError(f"--sweep={path}: no such Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sweep = module.get_sweep()
    if "config" not in sweep:
        raise ValueError(f"--sweep={path}: get_sweep() must return a dict with 'config' (the base config file)")
    unknown = set(sweep) - {"config", "overrides", "grid", "points", "command", "summary_keys"}
    if unknown:
        raise ValueError(f"--sweep={path}: unknown entries {sorted(unknown)}; expected "
                         f"config/overrides/grid/points/command/summary_keys")
    if sweep.get("command", PRETRAIN) not in COMMANDS:
        raise ValueError(f"--sweep={path}: command={sweep['command']!r}; expected one of {COMMANDS}")
    return sweep


def sweep_points(sweep: dict) -> list[dict]:
    """The varying overrides of every point, grid combinations first, then explicit points."""
    grid = sweep.get("grid", {})
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())] if grid else []
    points += [dict(p) for p in sweep.get("points", [])]
    if not points:
        raise ValueError("the sweep has no points: give `grid` or `points`")
    return points


def format_value(value) -> str:
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(format_value(v) for v in value) + ")"
    return str(value)


def run_name(point: dict) -> str:
    """'learning_rate=0.001,num_layers=4': the last part of each key, filesystem-safe."""
    parts = [f"{key.split('.')[-1]}={format_value(value)}" for key, value in point.items()]
    return re.sub(r"[^A-Za-z0-9=,._+-]", "_", ",".join(parts)) or "default"


def override_flags(overrides: dict) -> list[str]:
    return [f"--config.{key}={format_value(value)}" for key, value in overrides.items()]


def resolved_config(config_file: str, overrides: dict):
    """The config a point runs with: `get_config()` of config_file ("path.py" or "path.py:arg") plus overrides."""
    path, _, arg = config_file.partition(":")
    spec = importlib.util.spec_from_file_location("sweep_config", path)
    if spec is None or not paths.path(path).exists():
        raise FileNotFoundError(f"the sweep's config {config_file!r}: no such Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        if leaf not in node:
            raise KeyError(f"sweep override {key!r}: config {config_file} has no such key")
        node[leaf] = value
    return config


def tokenizer_settings(config) -> dict | None:
    """The settings a point's trained tokenizer is a function of; None when the point trains none."""
    from data_pipelines.tokenizers import training as tokenizer_training  # noqa: PLC0415 (imports the tokenizer libraries)

    data = config.data
    if config.get("init_from_hf", "") or data.source == "prepared" or data.tokenizer.get("path", ""):
        return None
    return tokenizer_training.training_settings(data)


def plan_runs(sweep: dict, sweep_dir: str) -> list[dict]:
    """One entry per point: name, workdir, overrides (common + the point's), argv of its pretrain command.

    A point that trains a tokenizer also gets `tokenizer` (the shared folder, also passed as
    data.tokenizer.path) and `tokenizer_argv` (the command that trains it).
    """
    points, names = sweep_points(sweep), set()
    for point in points:
        name = run_name(point)
        if name in names:
            raise ValueError(f"two sweep points are both named {name!r}; make their overrides differ")
        names.add(name)
    runs = []
    for point in points:
        name = run_name(point)
        overrides = {**sweep.get("overrides", {}), **point}
        run = dict(name=name, workdir=str(paths.path(sweep_dir) / name), point=point, tokenizer=None)
        config = resolved_config(sweep["config"], overrides)
        # Fine-tuning keeps its encoder's tokenizer: only pre-training points train (and share) one.
        settings = tokenizer_settings(config) if sweep.get("command", PRETRAIN) == PRETRAIN else None
        if settings is not None:
            digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
            run["tokenizer"] = str(paths.path(sweep_dir) / "tokenizers" / f"{settings['tokenizer']['kind']}-{digest}")
            run["tokenizer_argv"] = [sys.executable, "-m", "data_pipelines.tokenizer", f"--config={sweep['config']}",
                                     f"--out={run['tokenizer']}", *override_flags(overrides)]
            overrides = {**overrides, "data.tokenizer.path": run["tokenizer"]}
        run["overrides"] = overrides
        run["argv"] = [sys.executable, "-m", sweep.get("command", PRETRAIN), f"--config={sweep['config']}",
                       f"--workdir={run['workdir']}", *override_flags(overrides)]
        runs.append(run)
    return runs


def shared_tokenizers(runs: list[dict]) -> dict[str, list[str]]:
    """Each shared tokenizer folder -> the argv that trains it (one per distinct setting)."""
    return {run["tokenizer"]: run["tokenizer_argv"] for run in runs if run["tokenizer"]}


def tpu_commands(sweep: dict, runs: list[dict], args) -> list[list[str]]:
    """The shared tokenizers' training commands (run them first, once), then one TPU command per point."""
    tokenizers = [["python", "-m", "data_pipelines.tokenizer", *argv[3:]] for argv in shared_tokenizers(runs).values()]
    return tokenizers + [
        ["python", "-m", "launch.tpu_vm", "all", f"--name={args.tpu_name_prefix}-{i}", f"--zone={args.zone}",
         f"--accelerator_type={args.accelerator_type}", f"--config={sweep['config']}",
         f"--workdir={args.gcs_dir.rstrip('/')}/{run['name']}", "--",
         *override_flags(run["overrides"])]
        for i, run in enumerate(runs)
    ]


def train_shared_tokenizers(runs: list[dict]) -> None:
    """Trains each shared tokenizer the sweep lacks; one already there (a re-run sweep) is kept."""
    from data_pipelines.tokenizers import tokenizer as tokenizer_lib  # noqa: PLC0415

    for directory, argv in shared_tokenizers(runs).items():
        if tokenizer_lib.has_tokenizer(directory):
            print(f"[sweep] tokenizer {directory} is there: kept", flush=True)
            continue
        print(f"[sweep] training the shared tokenizer {directory}: {shlex.join(argv)}", flush=True)
        subprocess.run(argv, check=True)


def run_sweep(args) -> int:
    sweep = load_sweep(args.sweep)
    if args.executor == "tpu":
        runs = plan_runs(sweep, args.gcs_dir.rstrip("/"))
        for cmd in tpu_commands(sweep, runs, args):
            print(shlex.join(cmd))
        return 0
    runs = plan_runs(sweep, args.sweep_dir)
    if args.dry_run:
        for argv in [*shared_tokenizers(runs).values(), *(run["argv"] for run in runs)]:
            print(shlex.join(argv))
        return 0
    record = {"config": sweep["config"], "summary_keys": list(sweep.get("summary_keys", SUMMARY_KEYS)),
              "runs": [{k: r[k] for k in ("name", "overrides", "point", "tokenizer")} for r in runs]}
    paths.write_atomically(paths.path(args.sweep_dir) / "sweep.json",
                           json.dumps(record, indent=2, default=format_value))
    train_shared_tokenizers(runs)
    failed = []
    for i, run in enumerate(runs):
        print(f"[sweep] {i + 1}/{len(runs)} {run['name']}: {shlex.join(run['argv'])}", flush=True)
        if subprocess.run(run["argv"]).returncode:
            failed.append(run["name"])
    if failed:
        print(f"[sweep] failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _tokenizer_used(workdir) -> tuple[str | None, str | None]:
    """(sha256, kind) of the tokenizer a run used, from its config.json's run identity."""
    path = Workdir(workdir).config_json
    if not path.exists():
        return None, None
    config = json.loads(path.read_text())
    kind = (config["data"].get("tokenizer") or {}).get("kind")  # a fine-tuning run's is its encoder's
    return config.get("run_identity", {}).get("tokenizer_sha256"), kind


def summarize(sweep_dir: str) -> list[dict]:
    """Each run's final value of every SUMMARY_KEYS metric and its tokenizer; writes summary.md, summary.csv, curves.png."""
    sweep_dir = paths.path(sweep_dir)
    record = json.loads((sweep_dir / "sweep.json").read_text())
    runs, keys = record["runs"], tuple(record.get("summary_keys", SUMMARY_KEYS))
    table, curves, tokenizers = [], {}, {}
    for run in runs:
        workdir = sweep_dir / run["name"]
        rows = read_rows(Workdir(workdir).metrics_jsonl)
        final = {"run": run["name"], "step": max((r["step"] for r in rows), default=0)}
        for key in keys:
            values = [r[key] for r in rows if key in r]
            final[key] = values[-1] if values else None
        sha256, kind = _tokenizer_used(workdir)
        final["tokenizer"] = sha256[:12] if sha256 else None
        if sha256:
            tokenizers.setdefault((sha256, kind), []).append(run["name"])
        table.append(final)
        curves[run["name"]] = rows
    columns = ["run", "step", *keys, "tokenizer"]
    csv_text = io.StringIO(newline="")
    writer = csv.DictWriter(csv_text, columns)
    writer.writeheader()
    writer.writerows(table)
    paths.write_atomically(sweep_dir / "summary.csv", csv_text.getvalue())
    cell = lambda v: "—" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in table]
    kinds = sorted({kind for _, kind in tokenizers})
    per_kind = f", one per kind ({', '.join(kinds)})" if len(tokenizers) == len(kinds) > 1 else ""
    lines += ["", f"{len(tokenizers)} tokenizer(s){per_kind} (sha256 of tokenizer/):"]
    lines += [f"- `{sha256}` ({kind}): {', '.join(names)}" for (sha256, kind), names in tokenizers.items()]
    lines += _over_seeds(runs, table, keys)
    lines += sweep_downstream.summary_lines(str(sweep_dir), [run["name"] for run in runs])  # arms × tasks, if evaluated
    paths.write_atomically(sweep_dir / "summary.md", "\n".join(lines) + "\n")
    _plot_curves(curves, sweep_dir / "curves.png")
    return table


def _over_seeds(runs: list[dict], table: list[dict], keys) -> list[str]:
    """summary.md lines: each metric's mean ± std over the runs that differ only in `seed`."""
    if not any("seed" in run.get("point", {}) for run in runs):
        return []
    groups: dict[str, list[dict]] = {}
    for run, row in zip(runs, table):
        rest = {k: v for k, v in run.get("point", {}).items() if k != "seed"}
        groups.setdefault(run_name(rest) if rest else "(all)", []).append(row)
    lines = ["", "Over seeds (mean ± std):", "", "| point | seeds | " + " | ".join(keys) + " |",
             "|" + "---|" * (len(keys) + 2)]
    for name, rows in groups.items():
        cells = []
        for key in keys:
            values = [r[key] for r in rows if r[key] is not None]
            if not values:
                cells.append("—")
                continue
            mean = sum(values) / len(values)
            std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else 0.0
            cells.append(f"{mean:.4g} ± {std:.2g}")
        lines.append(f"| {name} | {len(rows)} | " + " | ".join(cells) + " |")
    return lines


def _plot_curves(curves: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("train/loss", "eval/loss")):
        for name, rows in curves.items():
            points = [(r["step"], r[key]) for r in rows if key in r]
            if points:
                ax.plot(*zip(*points), label=name, marker="o" if key.startswith("eval") else None)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    paths.write_atomically(path, png.getvalue())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or print) every point of a sweep file")
    run.add_argument("--sweep", required=True, help="the sweep file, e.g. configs/sweeps/tiny_lr.py")
    run.add_argument("--sweep_dir", required=True, help="one workdir per point is made under it")
    run.add_argument("--executor", choices=("local", "tpu"), default="local")
    run.add_argument("--dry_run", action="store_true", help="local: print the commands only")
    run.add_argument("--tpu_name_prefix", default="sweep")
    run.add_argument("--zone", default="us-central2-b")
    run.add_argument("--accelerator_type", default="v4-8")
    run.add_argument("--gcs_dir", default="gs://BUCKET/sweeps", help="tpu: workdirs go under it")
    summary = sub.add_parser("summary", help="tabulate and plot the runs of a sweep directory")
    summary.add_argument("--sweep_dir", required=True)
    sweep_downstream.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "evaluate":
        sys.exit(sweep_downstream.evaluate_sweep(args))
    if args.command == "run":
        sys.exit(run_sweep(args))
    table = summarize(args.sweep_dir)
    print((paths.path(args.sweep_dir) / "summary.md").read_text(), end="")
    print(f"{len(table)} runs; wrote summary.md, summary.csv, curves.png in {args.sweep_dir}")


if __name__ == "__main__":
    main()
