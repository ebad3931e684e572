"""A battery of fine-tuning tasks over seeds (and a learning-rate grid): `bert-jax evaluate`'s work.

    OUT/battery.json                    what was asked: the checkpoint, the suite, its tasks and seeds
    OUT/data/<task>/{train,dev}.jsonl   each task's rows as read and checked (the runs read these); a SQuAD-format
                                        task's (span_qa, tasks.<task>.format="squad") as its reader gives them
    OUT/data/<task>/sample.json         how they were drawn: the file, its rows, the cap, the seed, the label counts
    OUT/runs/<task>/lr=<lr>/seed=<s>/   one fine-tuning run each (bert_jax/finetune/run.py), DONE when finished
    OUT/scoreboard.{json,csv,md,png}    bert_jax/finetune/scoreboard.py, once every run is done

Everything that can be wrong with the input (a suite key, a task folder, a file's header, a
label outside the task's set, a checkpoint whose family cannot fine-tune the task) is checked
before anything is written to OUT or trained, and named in the error. A rerun skips the runs
that hold DONE and resumes the one that was killed from its checkpoints.

The runs go in waves (those that start from the checkpoint, then those that start from another task's
run, start_from_mnli), each run's config its task's recipe in battery.json plus a few overrides
(`run_overrides`). An executor runs a wave: `local_executor` here, one after another, in this process;
launch/executors.py's `ray_battery` as `python -m bert_jax.finetune` jobs of `bert-jax ray-tpu` on a Ray
cluster, all of a wave at once (configs/suites/battery_run.py gives them the recipe).
"""
import collections
import dataclasses
import json

import jax
import numpy as np
from absl import logging

from bert_jax import UserError
from bert_jax.progress import progress
from bert_jax.finetune import data, init_from, scoreboard, squad, zero_shot
from bert_jax.finetune.tasks import get_task
from bert_jax.parallel import distributed
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir, config_from_json
from bert_jax.run import completion
from bert_jax.run.refusal import refusal
from bert_jax.storage.retry import retried
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

METRICS = ("accuracy", "f1", "macro_f1", "matthews", "pearson", "spearman")
TEXT_FIELDS = ("text_a", "text_b")  # the columns of OUT/data's JSONL, whatever the source called them
TASK_KEYS = ("dir", "train", "dev", "columns", "text_fields", "label_field", "labels", "metric", "tfds",
             "tfds_fields", "tfds_dev", "tfds_labels", "init_from_task", "learning_rates", "max_train_rows",
             "max_dev_rows", "sample_seed", "finetune")
SAMPLE_FILE = "sample.json"  # in OUT/data/<task>/


@dataclasses.dataclass
class TaskData:
    """One task's checked rows: {"text_a", ["text_b",] "label"} each; rows that could not be used, by reason."""
    train: list[dict]
    dev: list[dict]
    sources: dict[str, str]  # split -> the file (or TFDS split) it came from
    skipped: collections.Counter
    samples: dict[str, dict] = dataclasses.field(default_factory=dict)  # split -> how its rows were drawn


@dataclasses.dataclass(frozen=True)
class Run:
    task: str
    learning_rate: float
    seed: int
    workdir: str


def select_tasks(suite, tasks: str = "") -> list[str]:
    """The suite's tasks to run (`--tasks=sst2,cola`, "" = all), those others start from first; unknown names and
    incomplete entries fail naming the key."""
    names = list(suite.tasks)
    wanted = [t.strip() for t in tasks.split(",") if t.strip()] or names
    unknown = [t for t in wanted if t not in names]
    if unknown:
        raise ValueError(f"--tasks: {unknown} not in suite {suite.name!r}; its tasks are {names}")
    for name in wanted:
        spec = suite.tasks[name]
        missing = [k for k in TASK_KEYS if k not in spec]
        if missing:
            raise ValueError(f"suite {suite.name!r}: tasks.{name} lacks {missing} (make it with "
                             f"configs/suites/recipe.py's task())")
        if spec.metric not in METRICS:
            raise ValueError(f"suite {suite.name!r}: tasks.{name}.metric={spec.metric!r}; expected one of {METRICS}")
        if not spec.learning_rates:
            raise ValueError(f"suite {suite.name!r}: tasks.{name}.learning_rates is empty")
        get_task(spec.finetune.task.kind).validate(spec.finetune.task)
        parent = starts_from(suite, name)
        if parent and parent not in names:
            raise ValueError(f"suite {suite.name!r}: tasks.{name}.init_from_task={parent!r} is not a task of it")
    parents = [p for p in dict.fromkeys(starts_from(suite, n) for n in wanted) if p]
    return parents + [n for n in wanted if n not in parents]


def starts_from(suite, name: str) -> str:
    """The task whose fine-tuned encoder `name` starts from ("" = the checkpoint itself)."""
    return suite.tasks[name].init_from_task if suite.get("start_from_mnli", False) else ""


# --- reading and checking the task files ----------------------------------------------------------------------

def _tsv(path: str, spec, name: str, skipped: collections.Counter) -> list[dict]:
    """A GLUE TSV file as dicts by column (GLUE leaves quotes bare: no quoting, as BERT's run_classifier)."""
    p = paths.path(path)
    if not p.exists():
        raise ValueError(f"{path} does not exist (suite task {name}: tasks.{name}.dir={spec.dir!r})")
    lines = p.read_text(encoding="utf-8").splitlines()
    if spec.columns:
        header = [c.strip() for c in spec.columns.split(",")]
    else:
        if not lines:
            raise ValueError(f"{path} is empty: it has no header line")
        header, lines = lines[0].split("\t"), lines[1:]
    needed = [f.strip() for f in spec.text_fields.split(",")] + [spec.label_field]
    absent = [c for c in needed if c not in header]
    if absent:
        raise ValueError(f"{path}: the {'columns' if spec.columns else 'header'} {header} lack {absent}, which "
                         f"the {name} reader needs (tasks.{name}.text_fields={spec.text_fields!r}, "
                         f"tasks.{name}.label_field={spec.label_field!r})")
    rows = []
    for line in lines:
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(header):
            skipped[f"{len(fields)} fields where the header has {len(header)}"] += 1
            continue
        rows.append(dict(zip(header, fields)))
    return rows


def _tfds(spec, split: str, data_dir: str, name: str) -> list[dict]:
    # Imported here: tensorflow_datasets is heavy and only this source needs it (no TensorFlow needed).
    import tensorflow_datasets as tfds  # noqa: PLC0415

    if not spec.tfds:
        raise ValueError(f"tasks.{name}.tfds is empty: this task has no TFDS source; give --glue_dir")
    try:  # a storage fault on the way (a bucket's timeout) is tried again, then raised with its cause
        source = retried(lambda: tfds.data_source(spec.tfds, split=split, data_dir=data_dir),
                         f"opening TFDS {spec.tfds!r} split {split!r} in {data_dir}")
    except ValueError as e:  # TFDS's refusal of a name or split it does not know (DatasetNotFoundError among them)
        raise ValueError(f"TFDS {spec.tfds!r} split {split!r} in {data_dir} (tasks.{name}.tfds): {e}") from None
    fields = [f.strip() for f in spec.tfds_fields.split(",")]
    names = [n.strip() for n in spec.tfds_labels.split(",") if n.strip()]
    rows = []
    for i in range(len(source)):
        record = source[i]
        values = [v.decode("utf-8") if isinstance(v, bytes) else v for v in (record[f] for f in fields)]
        label = values[-1]
        if names and isinstance(label, (int, np.integer)):
            label = names[int(label)] if 0 <= int(label) < len(names) else str(label)
        rows.append({**dict(zip(TEXT_FIELDS, map(str, values[:-1]))), "label": str(label)})
    return rows


def _checked(records: list[dict], spec, name: str, source: str, from_tfds: bool,
             skipped: collections.Counter) -> list[dict]:
    """Records -> {"text_a", ["text_b",] "label"}; an empty text is skipped and counted, a label outside the task's
    set (or not a number, for regression) fails naming the file and the row."""
    fields = [f.strip() for f in spec.text_fields.split(",")]
    labels = [n.strip() for n in spec.labels.split(",") if n.strip()]
    regression = not get_task(spec.finetune.task.kind).has_labels(spec.finetune.task)
    rows = []
    for number, record in enumerate(records, start=1):
        texts = [record[t] for t in TEXT_FIELDS[:len(fields)]] if from_tfds else [record[f] for f in fields]
        label = record["label"] if from_tfds else record[spec.label_field]
        if any(not t.strip() for t in texts):
            skipped["empty text"] += 1
            continue
        if regression:
            try:
                float(label)
            except ValueError:
                raise ValueError(f"{source}, row {number}: label {label!r} is not a number (task {name} is a "
                                 f"regression)") from None
        elif labels and label not in labels:
            raise ValueError(f"{source}, row {number}: label {label!r} is outside task {name}'s set {labels} "
                             f"(tasks.{name}.labels)")
        rows.append({**dict(zip(TEXT_FIELDS, texts)), "label": label})
    if not rows:
        raise ValueError(f"{source} holds no usable row for task {name}")
    return rows


def sample_rows(rows: list[dict], cap: int, seed: int, stratified: bool) -> list[dict]:
    """At most `cap` of `rows`, drawn from the whole list by `seed` (stratified: each label keeps its share, by
    largest remainder, and at least one row), in the order the file has them.

    Not the head of the file: exported datasets are often sorted by label, and their first 1,000 rows then hold
    one class, which no model can learn from or be scored on.
    """
    if not cap or len(rows) <= cap:
        return rows
    rng = np.random.default_rng(seed)
    if not stratified:
        return [rows[i] for i in sorted(rng.choice(len(rows), cap, replace=False))]
    by_label: dict[str, list[int]] = collections.defaultdict(list)
    for i, row in enumerate(rows):
        by_label[row["label"]].append(i)
    labels = sorted(by_label)
    share = np.array([len(by_label[k]) for k in labels]) * cap / len(rows)
    take = np.minimum(np.maximum(np.floor(share).astype(int), 1), [len(by_label[k]) for k in labels])
    for j in np.argsort(-(share - np.floor(share)), kind="stable"):  # largest remainders first, until the cap
        if take.sum() >= cap:
            break
        take[j] += take[j] < len(by_label[labels[j]])
    while take.sum() > cap:  # a cap below the number of labels: the most common labels give way
        take[int(np.argmax(take))] -= 1
    chosen = [i for k, n in zip(labels, take) for i in rng.choice(by_label[k], n, replace=False)]
    return [rows[i] for i in sorted(chosen)]


def label_counts(rows: list[dict]) -> dict[str, int]:
    return dict(sorted(collections.Counter(str(r["label"]) for r in rows).items()))


def read_task(suite, name: str, glue_dir: str = "", tfds_data_dir: str = "") -> TaskData:
    """Task `name`'s train and dev rows from --glue_dir's layout (or TFDS), checked; a split capped by
    tasks.<name>.max_<split>_rows is a seeded sample of the whole file (`sample_rows`). A classification split
    whose rows hold one label fails: a run on it scores chance, whatever the model."""
    spec = suite.tasks[name]
    stratified = get_task(spec.finetune.task.kind).has_labels(spec.finetune.task)
    skipped = collections.Counter()
    out, sources, samples = {}, {}, {}
    for split in ("train", "dev"):
        if glue_dir:
            folder = paths.path(glue_dir) / spec.dir
            if not folder.exists():
                raise ValueError(f"{folder} does not exist: task {name} reads {spec.dir}/ under --glue_dir "
                                 f"(tasks.{name}.dir)")
            source = str(folder / spec[split])
            if spec.get("format", "tsv") == "squad":  # SQuAD JSON (span_qa): rows as its reader checks them
                rows, squad_skipped = squad.read_squad(source)
                skipped.update(squad_skipped)
            else:
                rows = _checked(_tsv(source, spec, name, skipped), spec, name, source, False, skipped)
        else:
            tfds_split = "train" if split == "train" else spec.tfds_dev
            source = f"TFDS {spec.tfds}[{tfds_split}]"
            rows = _checked(_tfds(spec, tfds_split, tfds_data_dir, name), spec, name, source, True, skipped)
        cap = spec[f"max_{split}_rows"]
        kept = sample_rows(rows, cap, spec.sample_seed, stratified)
        samples[split] = {"source": source, "rows": len(rows), "kept": len(kept),
                          f"max_{split}_rows": cap, "sample_seed": spec.sample_seed if len(kept) < len(rows) else None,
                          "stratified_by_label": stratified and len(kept) < len(rows)}
        if stratified:
            samples[split].update(label_counts=label_counts(kept), file_label_counts=label_counts(rows))
            if len(samples[split]["label_counts"]) < 2:
                capped = f"tasks.{name}.max_{split}_rows={cap}, {len(rows)} rows" if cap else "all its rows"
                raise UserError(f"{source}: the {split} rows of task {name} hold one label "
                                f"{samples[split]['label_counts']} ({capped}); a run on them can only score "
                                f"chance: give a file with every label")
        if len(kept) < len(rows):
            logging.info("task %s: %d of %d %s rows, a sample by seed %d%s (tasks.%s.max_%s_rows)", name,
                         len(kept), len(rows), split, spec.sample_seed, ", stratified by label" if stratified else "",
                         name, split)
        out[split], sources[split] = kept, source
    if skipped:
        logging.warning("task %s: skipped %d row(s): %s", name, sum(skipped.values()),
                        ", ".join(f"{k}: {v}" for k, v in skipped.most_common()))
    return TaskData(out["train"], out["dev"], sources, skipped, samples)


# --- the runs ---------------------------------------------------------------------------------------------------

def seeds_of(suite, seeds: int | None) -> list[int]:
    n = suite.seeds if seeds is None else seeds
    if n < 1:
        raise ValueError(f"--seeds={n}: at least one seed per task")
    return list(range(n))


def plan_runs(suite, tasks: list[str], seeds: list[int], out: str) -> list[Run]:
    """Every task × learning rate × seed, in the order they run (tasks others start from first)."""
    root = paths.path(out) / "runs"
    return [Run(name, float(lr), seed, str(root / name / f"lr={float(lr):g}" / f"seed={seed}"))
            for name in tasks for lr in suite.tasks[name].learning_rates for seed in seeds]


def data_files(out: str, name: str) -> dict[str, str]:
    folder = paths.path(out) / "data" / name
    return {"train": str(folder / "train.jsonl"), "dev": str(folder / "dev.jsonl")}


def write_data(out: str, task_data: dict[str, TaskData]) -> None:
    """OUT/data/<task>/{train,dev}.jsonl: each task's checked rows, which its runs read, and sample.json, how they
    were drawn (process 0 writes them)."""
    for name, d in task_data.items():
        files = data_files(out, name)
        for split, rows in (("train", d.train), ("dev", d.dev)):
            paths.write_atomically(files[split], "".join(json.dumps(r) + "\n" for r in rows))
        paths.write_atomically(paths.path(out) / "data" / name / SAMPLE_FILE, json.dumps(d.samples, indent=2))


def finished_result(workdir: str) -> dict | None:
    """A fine-tuning run's results.json when the run is DONE, else None (it is to run, or to resume)."""
    done = Workdir(workdir).results_json
    return json.loads(done.read_text()) if completion.read_done(workdir) is not None and done.exists() else None


def run_overrides(suite, run: Run, files: dict[str, str], init: str) -> dict:
    """What one run changes in its task's fine-tuning config ({config key: value}): its encoder, seed, learning
    rate and OUT/data's files. The same keys go in-process (run_config) and on a command line (--executor=ray)."""
    spec = suite.tasks[run.task]
    n_texts = len([f for f in spec.text_fields.split(",") if f.strip()])
    return {"init_from": init, "seed": run.seed, "seeds": "", "data.format": "jsonl", "data.train": files["train"],
            "data.validation": files["dev"], "data.test": "", "task.text_fields": ",".join(TEXT_FIELDS[:n_texts]),
            "task.label_field": "label", "task.labels": spec.labels, "train.learning_rate": run.learning_rate}


def run_config(suite, run: Run, files: dict[str, str], init: str):
    """The fine-tuning config of one run: the task's (suite.tasks.<task>.finetune), on OUT/data's files."""
    c = suite.tasks[run.task].finetune.copy_and_resolve_references()
    for key, value in run_overrides(suite, run, files, init).items():
        *parents, leaf = key.split(".")
        node = c
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return c


def recipe(out: str, task: str):
    """Task `task`'s fine-tuning config as OUT/battery.json records it: what configs/suites/battery_run.py gives a
    run started as a command (the suite may have been changed in-process; the record holds what ran)."""
    path = paths.path(out) / "battery.json"
    if not path.exists():
        raise ValueError(f"{path} does not exist: no battery was prepared in {out}")
    recipes = json.loads(path.read_text())["recipes"]
    if task not in recipes:
        raise ValueError(f"{path} has no task {task!r}; its tasks are {sorted(recipes)}")
    return config_from_json(json.dumps(recipes[task]["finetune"]))


def check_checkpoint(suite, tasks: list[str], checkpoint: str, task_data: dict[str, TaskData]) -> init_from.Source:
    """The encoder at `checkpoint`, and proof that each task's model builds on its family and reads the task's
    rows through its tokenizer (a first example, as a run initialises with): before any training."""
    first = suite.tasks[tasks[0]].finetune
    try:
        source = init_from.resolve(checkpoint, first.model)
        tokenizer = tokenizer_lib.load_tokenizer(source.tokenizer_dir)
    except ValueError as e:
        if refusal(e) is None:  # a fault reading the checkpoint keeps its traceback
            raise
        raise ValueError(f"--checkpoint={checkpoint}: {e}") from None
    for name in tasks:
        c = run_config(suite, Run(name, 0.0, 0, ""), {"train": "", "dev": ""}, checkpoint)
        task = get_task(c.task.kind)
        try:
            rows = [task.parse(c.task, r, "train", collections.Counter()) for r in task_data[name].train[:2]]
            names = ([n for n in c.task.labels.split(",") if n] or sorted({r["label"] for r in rows})
                     if task.has_labels(c.task) else [])
            fast = data.fast_tokenizer(tokenizer, c.data.max_seq_length)
            features = task.featurize(c.task, c.data, fast, rows, names)
            example = {k: v[:1] for k, v in data.eval_batches(features, 1)[0].items()}
            model = task.build_model(source.family, source.model_cfg, c.task, task.num_outputs(names),
                                     "pooler" in source.params)
            jax.eval_shape(lambda m=model, b=example: m.init(jax.random.key(0), b, deterministic=True))
        except ValueError as e:  # what the family's and the task's checks refuse, named with the checkpoint and the
            if refusal(e) is None:  # task; a fault (a bug, a library's error) keeps its traceback
                raise
            raise ValueError(f"--checkpoint={checkpoint}: its family {source.family.name!r} cannot fine-tune task "
                             f"{name} ({c.task.kind}): {type(e).__name__}: {e}") from None
    return source


def _record(checkpoint: str, suite, tasks: list[str], seeds: list[int]) -> dict:
    return {"checkpoint": checkpoint, "suite": suite.name, "tasks": tasks, "seeds": seeds,
            "recipes": {n: json.loads(suite.tasks[n].to_json_best_effort()) for n in tasks}}


def check_out(out: str, record: dict) -> None:
    """An OUT that holds another battery (another checkpoint, suite or recipe) is refused, naming what differs."""
    path = paths.path(out) / "battery.json"
    if not path.exists():
        return
    before = json.loads(path.read_text())
    changed = [k for k in ("checkpoint", "suite") if before.get(k) != record[k]]
    changed += [f"tasks.{n}" for n in record["tasks"]
                if n in before.get("recipes", {}) and before["recipes"][n] != record["recipes"][n]]
    if changed:
        raise ValueError(f"{out} holds a battery with other {', '.join(changed)} ({path}); use a fresh --out")


def prepare(checkpoint: str, suite, out: str, glue_dir: str = "", tfds_data_dir: str = "", tasks: str = "",
            seeds: int | None = None):
    """Every check, then OUT's battery.json and data/: (runs, data by task, the checked source). Raises
    ValueError, having written nothing, on bad input."""
    if not glue_dir and not tfds_data_dir:
        raise ValueError("give --glue_dir (GLUE's TSV layout) or --tfds_data_dir (TFDS's prepared glue/*)")
    names = select_tasks(suite, tasks)
    seed_list = seeds_of(suite, seeds)
    task_data = {n: read_task(suite, n, glue_dir, tfds_data_dir) for n in names}
    source = check_checkpoint(suite, names, checkpoint, task_data)
    record = _record(checkpoint, suite, names, seed_list)
    check_out(out, record)
    if jax.process_index() == 0:
        write_data(out, task_data)
        paths.write_atomically(paths.path(out) / "battery.json", json.dumps(record, indent=2))
    distributed.sync("battery_data_written")  # the other hosts read what process 0 wrote
    return plan_runs(suite, names, seed_list, out), task_data, source


def waves(suite, runs: list[Run]) -> list[list[Run]]:
    """The runs in the order they can go: those that start from the checkpoint, then those that start from another
    task's runs (start_from_mnli). The runs of one wave do not depend on each other: an executor may run them at
    once."""
    first = [r for r in runs if not starts_from(suite, r.task)]
    return [w for w in (first, [r for r in runs if starts_from(suite, r.task)]) if w]


def starting_point(suite, run: Run, results: dict[Run, dict], checkpoint: str) -> str:
    """What `run` fine-tunes from (config.init_from): the checkpoint, or the finished run of the task it starts
    from with the same seed at that task's best learning rate (init_from.resolve reads a fine-tuning run)."""
    parent = starts_from(suite, run.task)
    if not parent:
        return checkpoint
    runs = {r: v for r, v in results.items() if r.task == parent}
    best = scoreboard.best_learning_rate(suite.tasks[parent].metric, runs)
    at_best = [r for r in runs if r.learning_rate == best]
    return next((r for r in at_best if r.seed == run.seed), at_best[0]).workdir


@dataclasses.dataclass
class Job:
    """A run to do: its fine-tuning config is its task's recipe (OUT/battery.json's) plus `overrides`; `source` is
    the checkpoint's encoder, already read, when the run starts from it (None: it starts from another run)."""
    run: Run
    out: str
    overrides: dict
    source: init_from.Source | None = None


def local_executor(suite, finetune_fn=None, finished=None):
    """Runs jobs here, one after another, in this process: (jobs) -> False when one was preempted. `finished()` is
    called after each run that finishes (the battery's progress)."""
    from bert_jax.finetune.run import run as finetune_run  # noqa: PLC0415 (run imports the whole harness)

    finetune_fn = finetune_fn or finetune_run

    def execute(jobs: list[Job]) -> bool:
        for i, job in enumerate(jobs):
            run, init = job.run, job.overrides["init_from"]
            print(f"[evaluate] {i + 1}/{len(jobs)} {run.task} lr={run.learning_rate:g} seed={run.seed}"
                  f"{'' if job.source else f' from {init}'}", flush=True)
            config = run_config(suite, run, data_files(job.out, run.task), init)
            if "validation" not in finetune_fn(config, run.workdir, source=job.source):
                return False
            if finished is not None:
                finished()
        return True

    return execute


def run_battery(checkpoint: str, suite, out: str, glue_dir: str = "", tfds_data_dir: str = "", tasks: str = "",
                seeds: int | None = None, finetune_fn=None, executor=None) -> dict[Run, dict] | None:
    """Runs what is not DONE, wave by wave (`waves`); returns each run's results.json, or None when a run was
    preempted (rerun the same command to go on).

    finetune_fn: how the local executor fine-tunes a run, (config, workdir, source=) -> results
      (bert_jax.finetune.run.run).
    executor: (jobs) -> bool, what runs a wave's jobs (False: one was preempted); default `local_executor`, here
      one after another. launch/executors.py's `ray_battery` submits each as a `ray-tpu` job.
    """
    runs, _, source = prepare(checkpoint, suite, out, glue_dir, tfds_data_dir, tasks, seeds)
    bar = progress(total=len(runs), desc="evaluate", unit="run")  # runs done of all, the rate, the ETA
    execute = executor or local_executor(suite, finetune_fn, lambda: bar.update(1))
    results: dict[Run, dict] = {}
    for wave in waves(suite, runs):
        jobs = []
        for run in wave:
            finished = finished_result(run.workdir)
            if finished is not None:
                results[run] = finished
                bar.update(1)
                metric = suite.tasks[run.task].metric
                print(f"[evaluate] kept {run.task} lr={run.learning_rate:g} seed={run.seed}: done before, "
                      f"{metric} {finished['validation'].get(metric, float('nan')):.4f} ({run.workdir})", flush=True)
                continue
            init = starting_point(suite, run, results, checkpoint)
            jobs.append(Job(run, out, run_overrides(suite, run, data_files(out, run.task), init),
                            source if init == checkpoint else None))
        if jobs and not execute(jobs):
            return None
        for job in jobs:
            result = finished_result(job.run.workdir)
            if result is None:
                raise RuntimeError(f"{job.run.workdir} holds no finished run after its executor returned")
            results[job.run] = result
        bar.update(len(results) - bar.n)  # another executor's runs: a wave at a time
    bar.close()
    return results


def process_config(suite):
    """The config whose process keys (distributed, compilation cache, platform flags) the battery's process runs
    with: its first fine-tuning task's, or its retrieval section's."""
    first = next(iter(suite.tasks.values()), None)
    return first.finetune if first is not None else suite.retrieval.finetune


def evaluate(checkpoint: str, suite, out: str, glue_dir: str = "", tfds_data_dir: str = "", tasks: str = "",
             seeds: int | None = None, finetune_fn=None, executor=None, beir_dir: str = "") -> dict | None:
    """The battery, then OUT/scoreboard.*: returns the scoreboard, or None when a run was preempted.

    A suite may mix kinds: fine-tuned tasks over seeds (`tasks`) and zero-shot retrieval datasets (its `retrieval`
    section, --beir_dir's subfolders; bert_jax/finetune/zero_shot.py), one scoreboard row each. Every input of
    both is checked before anything is written."""
    wanted = [t.strip() for t in tasks.split(",") if t.strip()]
    needs_beir = "retrieval" in suite and (not wanted or any(t not in suite.tasks for t in wanted))
    available = zero_shot.names(suite, beir_dir) if needs_beir or beir_dir else []
    unknown = [t for t in wanted if t not in suite.tasks and t not in available]
    if unknown:
        raise ValueError(f"--tasks: {unknown} not in suite {suite.name!r}; its tasks are "
                         f"{list(suite.tasks) + available}")
    finetuned = [t for t in wanted or suite.tasks if t in suite.tasks]
    datasets = [t for t in wanted or available if t in available]
    plan = zero_shot.prepare(checkpoint, suite, beir_dir, datasets)
    results = {}
    if finetuned:
        results = run_battery(checkpoint, suite, out, glue_dir, tfds_data_dir, ",".join(finetuned), seeds,
                              finetune_fn, executor)
        if results is None:
            return None
        record = json.loads((paths.path(out) / "battery.json").read_text())
    else:
        record = {"checkpoint": checkpoint, "suite": suite.name, "tasks": [], "seeds": []}
    board = scoreboard.build(record, {n: suite.tasks[n].metric for n in record["tasks"]}, results)
    board["tasks"].update(zero_shot.board_rows(zero_shot.run(checkpoint, suite, out, plan)))
    board["average"] = float(np.mean([t["median"] for t in board["tasks"].values()])) if board["tasks"] else None
    if jax.process_index() == 0:
        scoreboard.write(out, board)
    return board
