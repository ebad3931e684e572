"""The transformers `Trainer` side of the fine-tuning races (bench/finetune_vs_torch.py, bench/evaluate_vs_torch.py).

    python -m bench.trainer_finetune --model=/path/to/all-MiniLM-L6-v2 --data=/tmp/bigram_shift --seed=0
    python -m bench.trainer_finetune --model=/path/to/all-MiniLM-L6-v2 --runs=OUT/trainer_runs.json

What a transformers user writes: `AutoModelForSequenceClassification` from the folder (a fresh head on the pooled
[CLS]; one output and a squared error for a regression such as STS-B), the texts tokenized once, truncated to
max_seq_length and padded per batch by `DataCollatorWithPadding`, and `Trainer` with the recipe in its
`TrainingArguments`: AdamW (Trainer's default, torch's fused `adamw_torch_fused`) with weight decay on everything but
biases and LayerNorm weights (Trainer's own split, `Trainer.get_decay_parameter_names`), linear warmup then linear
decay to 0, gradient clipping, float32 on the CPU (`use_cpu`), eager PyTorch (no `torch.compile`), no checkpoints,
no progress bar, no reporting. The seed goes to `transformers.set_seed` before the head is initialised, as Hugging
Face's run_glue.py does, and to `TrainingArguments.seed` (dropout, batch order).

The recipe is a bert_jax fine-tuning config (`recipe_from_config`): the races read it from the config that the
bert_jax side runs, so the two cannot drift apart. Both sides take the same updates: ceil(epochs x rows / batch)
steps and round(warmup_fraction x steps) of warmup (bert_jax/finetune/run.py, optimizer.py), passed as `max_steps` and
`warmup_steps`; they validate at the same steps, bert_jax's own cadence (bert_jax/finetune/cadence.py): before the
first update (`eval_on_start`), every `eval_every` steps and at the last (which Trainer adds itself). The final
validation is the run's score; the test split, when there is one, is scored once at the end. Scores are bert_jax's
own metrics (bert_jax/finetune/metrics.py): one evaluator for both sides.

With --data (train.csv, validation.csv, test.csv: `sentence,label`, bench/make_finetune_data.py's) it runs the
recipe of the flags, as bench/torch_finetune.py does; with --runs, every run of a JSON list (`run_spec`'s dicts) in
this one process, as a user would script a battery. Prints one JSON line per run: its scores, its curves and its
wall-clock (`wall_s`: from the run's start, model loading included; the races time the whole process).
"""
import dataclasses
import json
import math
import sys
import tempfile
import time
import types

import numpy as np
from absl import app, flags

from bench.make_finetune_data import read_csv
from bert_jax.finetune import cadence, metrics

KINDS = {"classification": "accuracy", "regression": "spearman"}  # the kinds this side runs, and their headline


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One fine-tuning run's recipe, as a bert_jax fine-tuning config holds it (configs/finetune/common.py)."""
    kind: str = "classification"
    text_fields: tuple[str, ...] = ("sentence",)
    label_field: str = "label"
    labels: tuple[str, ...] = ()  # the label order; () = the training file's labels, sorted
    learning_rate: float = 2e-5
    epochs: float = 3.0
    batch_size: int = 32
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    max_seq_length: int = 128
    eval_every_steps: int = 0  # 0: at least evals_per_run validations, evenly spaced (bert_jax/finetune/cadence.py)
    evals_per_run: int = 10
    log_every_steps: int = 10


# Keys of a bert_jax config whose non-default values this side does not run: a race with one of them would not be
# one recipe, so it is refused, naming the key.
_UNSUPPORTED = {"task.pooling": "cls", "train.layer_lr_decay": 1.0, "train.freeze_embeddings": False,
                "train.freeze_layers": 0, "train.reinit_pooler": False, "train.parametrization": "standard",
                "train.grad_accum_steps": 1, "early_stopping.metric": "", "model.dtype": "float32"}


def _key(config, dotted: str):
    for part in dotted.split("."):
        config = config[part]
    return config


def recipe_from_config(config) -> Recipe:
    """The recipe of a bert_jax fine-tuning config (a sequence classification or regression); a key this side does
    not run, set away from its default, fails naming it."""
    if config.task.kind not in KINDS:
        raise ValueError(f"config.task.kind={config.task.kind!r}: the Trainer side runs {sorted(KINDS)}")
    for key, default in _UNSUPPORTED.items():
        if _key(config, key) != default:
            raise ValueError(f"config.{key}={_key(config, key)!r}: the Trainer side runs only {default!r}")
    t = config.train
    return Recipe(kind=config.task.kind, text_fields=tuple(f.strip() for f in config.task.text_fields.split(",")),
                  label_field=config.task.label_field,
                  labels=tuple(n.strip() for n in config.task.labels.split(",") if n.strip()),
                  learning_rate=float(t.learning_rate), epochs=float(t.epochs), batch_size=int(t.batch_size),
                  warmup_fraction=float(t.warmup_fraction), weight_decay=float(t.weight_decay), b1=float(t.b1),
                  b2=float(t.b2), eps=float(t.eps), max_grad_norm=float(t.max_grad_norm),
                  max_seq_length=int(config.data.max_seq_length), eval_every_steps=int(t.eval_every_steps),
                  evals_per_run=int(t.evals_per_run), log_every_steps=int(t.log_every_steps))


def run_spec(config, task: str = "", metric: str = "") -> dict:
    """One run of a bert_jax fine-tuning config as this side's --runs file lists it: its recipe, seed and files."""
    if not config.data.validation:
        raise ValueError("config.data.validation is empty: the Trainer side validates on a file of its own")
    return {"task": task, "seed": int(config.seed), "metric": metric or KINDS[config.task.kind],
            "recipe": dataclasses.asdict(recipe_from_config(config)),
            "files": {"train": config.data.train, "validation": config.data.validation, "test": config.data.test}}


def schedule(recipe: Recipe, n_train: int) -> cadence.Cadence:
    """bert_jax's step count and validation cadence for `n_train` rows (bert_jax/finetune/run.py)."""
    num_steps = max(1, math.ceil(recipe.epochs * n_train / recipe.batch_size))
    steps_per_epoch = max(1, math.ceil(n_train / recipe.batch_size))
    return cadence.make_cadence(recipe, types.SimpleNamespace(every_steps=0), num_steps, steps_per_epoch)


def warmup_steps(recipe: Recipe, num_steps: int) -> int:
    return int(round(recipe.warmup_fraction * num_steps))  # as bert_jax/finetune/optimizer.py


def training_arguments(recipe: Recipe, n_train: int, seed: int, output_dir: str):
    """Trainer's arguments for the recipe: bert_jax's steps, warmup and validation cadence, Trainer's defaults else."""
    import transformers  # noqa: PLC0415 (here: the races' drivers read recipes without loading torch)

    when = schedule(recipe, n_train)
    return transformers.TrainingArguments(
        output_dir=output_dir, use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
        seed=seed, learning_rate=recipe.learning_rate, weight_decay=recipe.weight_decay, adam_beta1=recipe.b1,
        adam_beta2=recipe.b2, adam_epsilon=recipe.eps, max_grad_norm=recipe.max_grad_norm,
        lr_scheduler_type="linear", max_steps=when.num_steps, warmup_steps=warmup_steps(recipe, when.num_steps),
        per_device_train_batch_size=recipe.batch_size, per_device_eval_batch_size=recipe.batch_size,
        eval_strategy="steps", eval_steps=when.eval_every, eval_on_start=True,
        logging_strategy="steps", logging_steps=when.log_every, dataloader_num_workers=0)


def read_split(path: str, recipe: Recipe) -> tuple[list, list[str]]:
    """(texts, labels) of a CSV (bench/make_finetune_data.py's) or a JSONL file (`bert-jax evaluate`'s OUT/data)."""
    if path.endswith(".jsonl"):
        with open(path) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        texts = [r[recipe.text_fields[0]] if len(recipe.text_fields) == 1 else tuple(r[t] for t in recipe.text_fields)
                 for r in rows]
        return texts, [str(r[recipe.label_field]) for r in rows]
    return read_csv(path, recipe.text_fields, recipe.label_field)


def _dataset(tokenizer, texts: list, targets: list, max_seq_length: int) -> list[dict]:
    """Tokenized rows, truncated but not padded (the collator pads each batch to its longest)."""
    pairs = bool(texts) and isinstance(texts[0], tuple)
    encoded = (tokenizer([t[0] for t in texts], [t[1] for t in texts], truncation=True, max_length=max_seq_length)
               if pairs else tokenizer(texts, truncation=True, max_length=max_seq_length))
    return [{**{k: v[i] for k, v in encoded.items()}, "labels": y} for i, y in enumerate(targets)]


def finetune(model_dir: str, files: dict[str, str], recipe: Recipe, seed: int, threads: int, output_dir: str,
             metric: str = "") -> dict:
    """One run: {"validation": the final validation's metrics, "test": the test split's (if any), "score": the
    validation's headline, "curves", "steps", "train_s", "wall_s"}."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    start = time.perf_counter()
    torch.set_num_threads(threads)
    transformers.set_seed(seed)  # before the head is initialised, as run_glue.py
    regression = recipe.kind == "regression"
    metric = metric or KINDS[recipe.kind]
    splits = {name: read_split(path, recipe) for name, path in files.items() if path}
    names = [] if regression else list(recipe.labels) or sorted(set(splits["train"][1]))
    for split, (_, labels) in splits.items():
        outside = sorted(set(labels) - set(names)) if not regression else []
        if outside:
            raise ValueError(f"{files[split]}: labels {outside[:5]} are outside the label set {names}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    data = {split: _dataset(tokenizer, texts, [float(y) for y in labels] if regression else
                            [names.index(y) for y in labels], recipe.max_seq_length)
            for split, (texts, labels) in splits.items()}
    head = (dict(num_labels=1, problem_type="regression") if regression else
            dict(num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)}))
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, **head)

    def compute_metrics(prediction) -> dict:
        logits, labels = np.asarray(prediction.predictions), np.asarray(prediction.label_ids)
        if regression:
            return metrics.regression_metrics(logits.reshape(len(labels), -1)[:, 0], labels)
        return metrics.classification_metrics(logits.argmax(-1), labels.astype(int), len(names))

    args = training_arguments(recipe, len(data["train"]), seed, output_dir)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data["train"],
                                   eval_dataset=data["validation"], processing_class=tokenizer,
                                   data_collator=transformers.DataCollatorWithPadding(tokenizer),
                                   compute_metrics=compute_metrics)
    train_start = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - train_start
    history = trainer.state.log_history
    evals = [h for h in history if "eval_loss" in h]
    curves = {"train_loss": [(h["step"], h["loss"]) for h in history if "loss" in h],
              "val_loss": [(h["step"], h["eval_loss"]) for h in evals],
              f"val_{metric}": [(h["step"], h[f"eval_{metric}"]) for h in evals]}
    validation = {k.removeprefix("eval_"): v for k, v in evals[-1].items() if k.startswith("eval_")}
    test = ({k.removeprefix("test_"): v for k, v in
             trainer.evaluate(data["test"], metric_key_prefix="test").items() if k.startswith("test_")}
            if "test" in data else {})
    return {"side": "trainer", "seed": seed, "metric": metric, "score": validation[metric], "validation": validation,
            "test": test, "steps": args.max_steps, "train_s": train_s, "wall_s": time.perf_counter() - start,
            "curves": curves}


def _flags_run(f) -> dict:
    """The run the flags describe: bench/torch_finetune.py's flags and recipe."""
    recipe = Recipe(learning_rate=f.learning_rate, epochs=f.epochs, batch_size=f.batch_size,
                    max_seq_length=f.max_seq_length, evals_per_run=f.evals_per_run)
    return {"task": "", "seed": f.seed, "metric": "accuracy", "recipe": dataclasses.asdict(recipe),
            "files": {name: f"{f.data}/{name}.csv" for name in ("train", "validation", "test")}}


def _main(argv) -> None:
    del argv
    f = flags.FLAGS
    if bool(f.runs) == bool(f.data):
        raise app.UsageError("give --data (one run, the flags' recipe) or --runs (a JSON list of runs), not both")
    if f.runs:
        with open(f.runs) as runs_file:
            runs = json.load(runs_file)
    else:
        runs = [_flags_run(f)]
    for run in runs:
        recipe = Recipe(**{k: tuple(v) if isinstance(v, list) else v for k, v in run["recipe"].items()})
        with tempfile.TemporaryDirectory() as output_dir:  # Trainer wants one; it saves nothing here
            result = finetune(f.model, run["files"], recipe, run["seed"], f.threads, output_dir, run["metric"])
        result.update(task=run["task"], learning_rate=recipe.learning_rate)
        if result["metric"] == "accuracy":  # the keys bench/finetune_vs_torch.py reads, as torch_finetune.py's
            result.update(validation_accuracy=result["validation"]["accuracy"],
                          test_accuracy=result["test"].get("accuracy"))
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    flags.DEFINE_string("model", None, "A Hugging Face model folder.")
    flags.DEFINE_string("data", "", "A folder with train.csv, validation.csv, test.csv (sentence,label).")
    flags.DEFINE_string("runs", "", "A JSON list of runs (run_spec's dicts), run one after another in this process.")
    flags.DEFINE_integer("seed", 0, "--data: classifier init, dropout and batch order.")
    flags.DEFINE_float("epochs", 3.0, "--data: epochs.")
    flags.DEFINE_float("learning_rate", 2e-5, "--data: peak AdamW learning rate.")
    flags.DEFINE_integer("batch_size", 32, "--data: examples per step.")
    flags.DEFINE_integer("max_seq_length", 128, "--data: truncation length in tokens.")
    flags.DEFINE_integer("evals_per_run", 10, "--data: validations per run (and one before training).")
    flags.DEFINE_integer("threads", 2, "torch.set_num_threads.")
    flags.mark_flags_as_required(["model"])
    sys.exit(app.run(_main))
