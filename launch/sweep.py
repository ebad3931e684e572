"""Sweeps: a base config and a grid (or list) of overrides -> one pre-training run per point (`bert-jax sweep`;
`evaluate` is launch/sweep_downstream.py).

A sweep file is Python with `get_sweep()` returning a dict:
    config     the base config file, e.g. "configs/tiny.py"
    overrides  {key: value} applied to every point (optional)
    grid       {key: [values]}: every combination is a point (optional)
    points     [{key: value}]: explicit points, added after the grid (optional)
    command    the module each point runs (optional): "bert_jax.commands.pretrain" (default) or
               "bert_jax.finetune", e.g. a grid of train.learning_rate x train.epochs x seed
               over configs/finetune/classification.py
    summary_keys  the metrics summary.md lists (optional; default SUMMARY_KEYS)
Keys are config paths without the `config.` prefix ("train.learning_rate"). Each run's
workdir is `<sweep_dir>/<name>`, the name built from the point's own overrides
("learning_rate=0.001"), and `<sweep_dir>/sweep.json` records name -> overrides; it is written
before any point starts, whatever the executor, so `summary` works while points run. Every point
logs to wandb (when on) as one run named for the point, grouped by the sweep (its directory's name).

Executors (`--executor`, launch/executors.py, shared with `bert-jax evaluate`):
    local  runs the points here, `--parallel` at once (default 1), each one's output in
           <sweep_dir>/logs/<name>.log when more than one runs at a time
    ray    one `bert-jax ray-tpu` job per point (of pre-training or fine-tuning) on a Ray cluster of TPU
           slices (`--address`, `--tpu`), all submitted at once: each waits for a free slice, and is
           relaunched after preemptions until its DONE, so as many run at once as the cluster has slices
    tpu    prints one `bert-jax tpu-vm all` command per point (its own spot slice, the code cloned from
           `--repo_url`, the slice deleted once the point's DONE appears); no relaunch after a preemption:
           use `ray` for that
`summary` writes summary.md, summary.csv and curves.png (train loss and eval loss of every run)
into the sweep directory: each run's final and best value of every summary key (best: the lowest
loss, the highest of anything else), its state (done, running, pending) and its goodput across its restarts
(`bert-jax inspect --mode=goodput`'s last line, once it has records); when the grid varies
`seed`, each metric's median [min–max] and n over the seeds of every other point (small-data
fine-tuning is unstable: the spread is the result). A pre-training sweep's rows also name each arm's
objective (and, when an arm is a branch, its lineage: "runs/stable@100 > decay"), and where
arms differ in objective, mask rate, masking, vocabulary or sequence length
(LOSS_DEPENDS_ON) the loss and MLM-accuracy columns are marked † with the reason: those do not compare,
a battery downstream does (`sweep evaluate`). Columns come from `run_row` and the callables
in ROW_COLUMNS (workdir, run -> {column: value}), so a tool can add its own (downstream scores); a
value that is a launch/summary_cell.py Cell shows its text in summary.md and its numbers, each in its
own column, in summary.csv.

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
import csv
import hashlib
import importlib.util
import itertools
import io
import json
import re
import runpy
import shlex
import statistics
import subprocess
import sys
from typing import Callable

from bert_jax import UserError
from bert_jax.registry import Registry, registered_as
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.run import goodput, lineage
from bert_jax.run.completion import read_done
from bert_jax.run.metrics_file import read_rows
from bert_jax.launch import executors
from bert_jax.launch import summary_cell, sweep_downstream
from bert_jax.launch.executors import format_value, override_flags

SUMMARY_KEYS = ("train/loss", "train/mlm_accuracy", "train/masked_fraction", "eval/loss", "eval/mlm_accuracy",
                "perf/tokens_per_s")
# What a pre-training loss (and MLM accuracy) depends on besides the model: arms that differ in one do not compare
# by them (docs/design.md, "Arms are judged downstream"). {what, as the summary names it: its config.json path;
# "vocabulary" is the tokenizer's sha256 and "objective" run_row's column}.
LOSS_DEPENDS_ON = {"objective": "objective", "mask rate": "data.mask_rate", "masking": "data.masking",
                   "vocabulary": "tokenizer", "sequence length": "data.max_seq_length"}
PRETRAIN = "bert_jax.commands.pretrain"
COMMANDS = (PRETRAIN, "bert_jax.finetune")
# Extra summary columns: each callable gets (a run's workdir, its sweep.json entry) and returns {column: value}.
# The run's goodput across its restarts (bert_jax/run/goodput.py; shown beside the state, once a run has
# records), then the scores of `sweep evaluate`, if run.
ROW_COLUMNS: list[Callable[..., dict]] = [goodput.summary_column, sweep_downstream.row_columns]


def load_sweep(path: str) -> dict:
    spec = importlib.util.spec_from_file_location("sweep_file", path)
    if spec is None or not paths.path(path).is_file():
        raise UserError(f"--sweep={path}: no such Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sweep = module.get_sweep()
    if "config" not in sweep:
        raise UserError(f"--sweep={path}: get_sweep() must return a dict with 'config' (the base config file)")
    unknown = set(sweep) - {"config", "overrides", "grid", "points", "command", "summary_keys"}
    if unknown:
        raise UserError(f"--sweep={path}: unknown entries {sorted(unknown)}; expected "
                        f"config/overrides/grid/points/command/summary_keys")
    if sweep.get("command", PRETRAIN) not in COMMANDS:
        raise UserError(f"--sweep={path}: command={sweep['command']!r}; expected one of {COMMANDS}")
    return sweep


def sweep_points(sweep: dict) -> list[dict]:
    """The varying overrides of every point, grid combinations first, then explicit points."""
    grid = sweep.get("grid", {})
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())] if grid else []
    points += [dict(p) for p in sweep.get("points", [])]
    if not points:
        raise UserError("the sweep has no points: give `grid` or `points`")
    return points


def run_name(point: dict) -> str:
    """'learning_rate=0.001,num_layers=4': the last part of each key, filesystem-safe."""
    parts = [f"{key.split('.')[-1]}={format_value(value)}" for key, value in point.items()]
    return re.sub(r"[^A-Za-z0-9=,._+-]", "_", ",".join(parts)) or "default"


def resolved_config(config_file: str, overrides: dict):
    """The config a point runs with: `get_config()` of config_file ("path.py" or "path.py:arg") plus overrides."""
    path, _, arg = config_file.partition(":")
    spec = importlib.util.spec_from_file_location("sweep_config", path)
    if spec is None or not paths.path(path).exists():
        raise UserError(f"the sweep's config {config_file!r}: no such Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config(arg) if arg else module.get_config()
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        if leaf not in node:
            raise UserError(f"sweep override {key!r}: config {config_file} has no such key")
        node[leaf] = value
    return config


def tokenizer_settings(config) -> dict | None:
    """The settings a point's trained tokenizer is a function of; None when the point trains none."""
    # Imported here: they load the tokenizer libraries, which only a sweep that trains a tokenizer needs.
    from data_pipelines.sources import documents as sources
    from data_pipelines.tokenizers import training as tokenizer_training

    data = config.data
    if config.get("init_from_hf", "") or sources.source_of(data).tokenized or data.tokenizer.get("path", ""):
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
            raise UserError(f"two sweep points are both named {name!r}; make their overrides differ")
        names.add(name)
    runs = []
    for point in points:
        name = run_name(point)
        overrides = {**sweep.get("overrides", {}), **point}
        run = dict(name=name, workdir=str(paths.path(sweep_dir) / name), point=point, tokenizer=None)
        config = resolved_config(sweep["config"], overrides)
        # wandb: one run per point, named for it, grouped by the sweep (a config without the keys is left alone)
        logging_keys = config.get("logging") or {}
        wandb = {f"logging.{k}": v for k, v in (("wandb_group", sweep_name(sweep_dir)), ("wandb_run_name", name))
                 if k in logging_keys and f"logging.{k}" not in overrides}
        overrides = {**wandb, **overrides}
        # Fine-tuning keeps its encoder's tokenizer: only pre-training points train (and share) one.
        settings = tokenizer_settings(config) if sweep.get("command", PRETRAIN) == PRETRAIN else None
        if settings is not None:
            digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
            run["tokenizer"] = str(paths.path(sweep_dir) / "tokenizers" / f"{settings['tokenizer']['kind']}-{digest}")
            run["tokenizer_argv"] = [sys.executable, "-m", "bert_jax.commands.tokenizer", f"--config={sweep['config']}",
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


def sweep_name(sweep_dir: str) -> str:
    """The sweep's name (its directory's): the wandb group of its points."""
    return str(sweep_dir).rstrip("/").rsplit("/", 1)[-1] or "sweep"


def tpu_commands(sweep: dict, runs: list[dict], args) -> list[list[str]]:
    """The shared tokenizers' training commands (run them first, once), then one TPU command per point:
    its own slice (spot unless --capacity says otherwise), the code from --repo_url, deleted after its DONE."""
    if not args.repo_url or "OWNER" in args.repo_url:
        raise UserError("--executor=tpu clones the code onto each slice: give --repo_url (and --branch)")
    capacity = {"spot": ["--spot"], "preemptible": ["--preemptible"], "on_demand": []}[args.capacity]
    tokenizers = [["bert-jax", "tokenizer", *argv[3:]] for argv in shared_tokenizers(runs).values()]
    return tokenizers + [
        ["bert-jax", "tpu-vm", "all", f"--name={args.tpu_name_prefix}-{i}", f"--zone={args.zone}",
         f"--accelerator_type={args.accelerator_type}", *capacity, f"--repo_url={args.repo_url}",
         f"--branch={args.branch}", "--delete_when_done", f"--config={sweep['config']}",
         f"--workdir={run['workdir']}", "--", *override_flags(run["overrides"])]
        for i, run in enumerate(runs)
    ]


class TpuVmExecutor(executors.Executor):
    """Each point on a TPU VM of its own (`bert-jax tpu-vm all`): the commands are printed for the user to run."""

    prints_only = True

    def check(self, args, shared_dir: str, flag: str) -> None:
        if not paths.is_remote(shared_dir):
            # Every slice's hosts must see the same workdirs, and they outlive the slices.
            raise UserError(f"--executor=tpu: give a gs:// or s3:// {flag}, not {shared_dir!r}")

    def sweep_commands(self, sweep: dict, runs: list[dict], args) -> list[list[str]]:
        return tpu_commands(sweep, runs, args)


# The shared executors (launch/executors.py) and the one only a sweep offers.
EXECUTORS: Registry[type[executors.Executor]] = Registry("--executor", "executors")
for _name, _executor in executors.EXECUTORS.items():
    EXECUTORS.register(_name, _executor)
registered_as(EXECUTORS, "tpu")(TpuVmExecutor)


def point_argv(sweep: dict, run: dict, args) -> list[str]:
    """A point's command: here, or as a `ray-tpu` job (launch/executors.py) of the sweep's command."""
    return EXECUTORS.get(args.executor)().argv(args, sweep.get("command", PRETRAIN), sweep["config"], run["workdir"],
                                               run["overrides"], run["argv"])


def sweep_record(sweep: dict, runs: list[dict]) -> dict:
    """sweep.json: the base config, the summary keys, and each point's name, overrides and tokenizer."""
    return {"config": sweep["config"], "command": sweep.get("command", PRETRAIN),
            "summary_keys": list(sweep.get("summary_keys", SUMMARY_KEYS)),
            "runs": [{k: r[k] for k in ("name", "overrides", "point", "tokenizer")} for r in runs]}


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
    sweep_dir = args.sweep_dir.rstrip("/")
    executor = EXECUTORS.get(args.executor)()
    executor.check(args, sweep_dir, "--sweep_dir")
    runs = plan_runs(sweep, sweep_dir)
    commands = (executor.sweep_commands(sweep, runs, args) if executor.prints_only else
                [*shared_tokenizers(runs).values(), *(point_argv(sweep, run, args) for run in runs)])
    if args.dry_run:
        for argv in commands:
            print(shlex.join(argv))
        return 0
    paths.write_atomically(paths.path(sweep_dir) / "sweep.json",  # first: `summary` works while points run
                           json.dumps(sweep_record(sweep, runs), indent=2, default=format_value))
    if executor.prints_only:
        print(f"# wrote {sweep_dir}/sweep.json; run these (the tokenizers first), then "
              f"bert-jax sweep summary --sweep_dir={sweep_dir}")
        for cmd in commands:
            print(shlex.join(cmd))
        return 0
    train_shared_tokenizers(runs)
    parallel = executor.parallel(args, len(runs))
    log_dir = paths.path(args.log_dir or (f"{sweep_dir}/logs" if not paths.is_remote(sweep_dir) else
                                          f"sweep_logs/{sweep_name(sweep_dir)}"))
    failed = executors.run_commands([(run["name"], point_argv(sweep, run, args)) for run in runs], parallel, log_dir)
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


def best_of(key: str, values: list[float]) -> float:
    """The best of a metric's values: the lowest loss (or perplexity), the highest of anything else."""
    return min(values) if "loss" in key or "perplexity" in key else max(values)


def objective(config: dict) -> str | None:
    """What a pre-training run's loss is made of ("mlm+nsp", "generator_mlm+discriminator", "+ distillation"), from
    its config.json: the family's objective (bert_jax/families.py) and a distillation teacher."""
    model = config.get("model") or {}
    if "family" not in model:
        return None
    from bert_jax.families import get_family  # noqa: PLC0415 (the registry loads every family's model)
    from bert_jax.storage.workdir import config_from_json  # noqa: PLC0415

    try:
        terms = get_family(model["family"]).objective_for(config_from_json(json.dumps(model))).loss_terms
    except (ValueError, KeyError, TypeError):  # a family this code no longer builds: named as it is
        return model["family"]
    teacher = (config.get("distill") or {}).get("teacher")
    return "+".join(t.removesuffix("_loss") for t in terms) + (" + distillation" if teacher else "")


def run_row(workdir, run: dict, keys, rows: list[dict]) -> dict:
    """A run's summary row: its state, last step, each key's final and best value, and its tokenizer."""
    state = "done" if read_done(workdir) is not None else "running" if rows else "pending"
    row = {"run": run["name"], "state": state, "step": max((r["step"] for r in rows), default=0)}
    for key in keys:
        values = [r[key] for r in rows if key in r]
        row[key] = values[-1] if values else None
        row[f"best {key}"] = best_of(key, values) if values else None
    sha256, kind = _tokenizer_used(workdir)
    row["tokenizer"] = sha256[:12] if sha256 else None
    row["_tokenizer"] = (sha256, kind)
    return row


def arm_rows(sweep_dir, record: dict) -> tuple[list[dict], dict]:
    """One row per run of sweep.json (run_row, a pre-training run's objective, every ROW_COLUMNS callable's
    columns), and their curves."""
    keys = tuple(record.get("summary_keys", SUMMARY_KEYS))
    table, curves = [], {}
    for run in record["runs"]:
        workdir = paths.path(sweep_dir) / run["name"]
        rows = read_rows(Workdir(workdir).metrics_jsonl)
        row = run_row(workdir, run, keys, rows)
        config_json = Workdir(workdir).config_json
        row["objective"] = (objective(json.loads(config_json.read_text()))  # a pre-training run's loss
                            if config_json.exists() and record.get("command", PRETRAIN) == PRETRAIN else None)
        ancestors = lineage.read(str(workdir))  # a branch's: where it started
        row["lineage"] = lineage.describe(ancestors, run["name"]) if ancestors else None
        for columns in ROW_COLUMNS:
            row.update(columns(workdir, run))
        table.append(row)
        curves[run["name"]] = rows
    return table, curves


def loss_differences(sweep_dir, table: list[dict]) -> list[str]:
    """Why the arms' losses and MLM accuracies do not compare ([] when they do): each of LOSS_DEPENDS_ON they
    differ in, with the arms of each value ("mask rate 0.15: a, b; 0.3: c")."""
    values: dict[str, dict[str, list[str]]] = {}
    for row in table:
        config_json = Workdir(paths.path(sweep_dir) / row["run"]).config_json
        if not config_json.exists():
            continue
        flat = {**_flat(json.loads(config_json.read_text())), "objective": row.get("objective"),
                "tokenizer": row.get("tokenizer")}
        for what, key in LOSS_DEPENDS_ON.items():
            values.setdefault(what, {}).setdefault(json.dumps(flat.get(key)), []).append(row["run"])
    return [f"{what} " + "; ".join(f"{json.loads(v)}: {', '.join(arms)}" for v, arms in by_value.items())
            for what, by_value in values.items() if len(by_value) > 1]


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def by_loss(key: str) -> bool:
    """Whether a summary key is a pre-training loss or MLM accuracy (what LOSS_DEPENDS_ON changes)."""
    return "loss" in key or "mlm_accuracy" in key or "perplexity" in key


def summarize(sweep_dir: str) -> list[dict]:
    """Each run's state, final and best value of every summary key and its tokenizer, then the seeds grouped;
    writes summary.md, summary.csv, curves.png. Works while points run (pending ones show —)."""
    sweep_dir = paths.path(sweep_dir)
    record = json.loads((sweep_dir / "sweep.json").read_text())
    runs, keys = record["runs"], tuple(record.get("summary_keys", SUMMARY_KEYS))
    table, curves = arm_rows(sweep_dir, record)
    tokenizers = {}
    for row in table:
        sha256, kind = row.pop("_tokenizer")
        if sha256:
            tokenizers.setdefault((sha256, kind), []).append(row["run"])
    differ = loss_differences(sweep_dir, table) if record.get("command", PRETRAIN) == PRETRAIN else []
    for row in table:  # the same for every arm: whether its losses stand beside the others'
        row["loss_comparable"], row["loss_differs_in"] = not differ, "; ".join(differ) or None
    extra = [c for c in table[0] if c not in {"run", "state", "step", "objective", "lineage", "goodput", "tokenizer",
                                              "loss_comparable", "loss_differs_in", *keys,
                                              *(f"best {k}" for k in keys)}]
    about = ["objective"] if any(row["objective"] for row in table) else []
    about += ["lineage"] if any(row["lineage"] for row in table) else []  # only a sweep with branches
    about += ["goodput"] if any(row["goodput"] for row in table) else []  # runs that kept goodput records
    columns = ["run", "state", "step", *about, *(c for k in keys for c in (k, f"best {k}")), *extra,
               "tokenizer", *(["loss_comparable", "loss_differs_in"] if differ else [])]
    csv_columns, csv_rows = summary_cell.csv_columns(table, columns)  # numbers, each in its own column
    csv_text = io.StringIO(newline="")
    writer = csv.DictWriter(csv_text, csv_columns)
    writer.writeheader()
    writer.writerows(csv_rows)
    paths.write_atomically(sweep_dir / "summary.csv", csv_text.getvalue())
    mark = " †" if differ else ""
    shown = ["run", "state", "step", *about, *(f"{k} (best){mark if by_loss(k) else ''}" for k in keys),
             *extra, "tokenizer"]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for row in table:
        cells = [row["run"], row["state"], str(row["step"]), *(_cell(row[c]) for c in about)]
        cells += [_cell(row[k]) + ("" if row[k] is None else f" ({_cell(row[f'best {k}'])})") for k in keys]
        cells += [_cell(row[c]) for c in extra] + [_cell(row["tokenizer"])]
        lines.append("| " + " | ".join(cells) + " |")
    if differ:
        lines += ["", f"† not comparable across these arms, which differ in {'; and in '.join(differ)}: judge them "
                      f"downstream (`bert-jax sweep evaluate`)."]
    kinds = sorted({kind for _, kind in tokenizers})
    per_kind = f", one per kind ({', '.join(kinds)})" if len(tokenizers) == len(kinds) > 1 else ""
    lines += ["", f"{len(tokenizers)} tokenizer(s){per_kind} (sha256 of tokenizer/):"]
    lines += [f"- `{sha256}` ({kind}): {', '.join(names)}" for (sha256, kind), names in tokenizers.items()]
    lines += _over_seeds(runs, table, (*keys, *extra))
    paths.write_atomically(sweep_dir / "summary.md", "\n".join(lines) + "\n")
    _plot_curves(curves, sweep_dir / "curves.png")
    return table


def _cell(value) -> str:
    return "—" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def spread(values: list[float]) -> str:
    """'0.8 [0.7–0.9]': the median and the range of a point's values over its seeds."""
    return f"{statistics.median(values):.4g} [{min(values):.4g}–{max(values):.4g}]"


def _over_seeds(runs: list[dict], table: list[dict], keys) -> list[str]:
    """summary.md lines: each metric's median [min–max] and n over the runs that differ only in `seed`."""
    if not any("seed" in run.get("point", {}) for run in runs):
        return []
    groups: dict[str, list[dict]] = {}
    for run, row in zip(runs, table):
        rest = {k: v for k, v in run.get("point", {}).items() if k != "seed"}
        groups.setdefault(run_name(rest) if rest else "(all)", []).append(row)
    lines = ["", "Over seeds (final values: median [min–max]; n: seeds with a value):", "",
             "| point | n | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 2)]
    for name, rows in groups.items():
        cells = []
        for key in keys:
            values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
            cells.append(spread(values) if values else "—")
        counted = max((sum(isinstance(r.get(k), (int, float)) for r in rows) for k in keys), default=0)
        lines.append(f"| {name} | {counted} | " + " | ".join(cells) + " |")
    return lines


def _plot_curves(curves: dict, path) -> None:
    import matplotlib  # noqa: PLC0415 (seconds of start-up, for `summary` only)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (after choosing the headless backend)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key in zip(axes, ("train/loss", "eval/loss")):
        for name, rows in curves.items():
            points = [(r["step"], r[key]) for r in rows if key in r]
            if points:
                ax.plot(*zip(*points), label=name, marker="o" if key.startswith("eval") else None)
        ax.set_xlabel("step")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        if ax.lines:  # (a sweep whose points have not logged yet has none)
            ax.legend(fontsize=7)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=100)
    plt.close(fig)
    paths.write_atomically(path, png.getvalue())


if __name__ == "__main__":  # `python -m launch.sweep` from the repository root: the `bert-jax sweep` command
    runpy.run_module("bert_jax.commands.sweep", run_name="__main__", alter_sys=True)
