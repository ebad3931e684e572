"""Which objective, at equal FLOPs: MLM, CLM then MLM (two splits), or CLM (issue 78; Gisserot-Boukhlef et al. 2025,
arXiv 2507.00994, "Should We Still Pretrain Encoders with Masked Language Modeling?"; Ettin, Weller et al. 2025).

    python bench/objectives_study.py --out=/tmp/objectives [--flops=7.2e11] [--seeds=3] [--probe_steps=50]

Every arm is configs/modernbert_base.py:tiny on the embedded corpus, sized by one FLOP budget (`train.budget`: MLM
alone's 400 steps at 1.80e9 FLOPs a step by default; a causal step costs more, so the causal arms take fewer steps):
  mlm      MLM alone
  clm25    CLM for the first 25 % of the steps, then MLM (`:tiny,biphasic`)
  clm50    the same at 50 %
  clm      CLM alone (`:tiny,clm`); a short MLM probe (--probe_steps, a branch off its last step) gives it an eval
           MLM loss, which the other arms log themselves
Each arm (the probe's branch for clm) is then judged downstream by `bert-jax evaluate --suite=smoke` over --seeds
seeds on a GLUE-layout SST-2 and STS-B made from the tests' sentiment rows (tests/test_evaluate.py's write_glue):
medians of SST-2 accuracy and STS-B Spearman. Prints a markdown table; OUT/results.json holds it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "configs/modernbert_base.py"
ARMS = {
    "mlm": ("tiny", []),
    "clm25": ("tiny,biphasic", ["--config.train.objective_switch.fraction=0.25"]),
    "clm50": ("tiny,biphasic", ["--config.train.objective_switch.fraction=0.5"]),
    "clm": ("tiny,clm", []),
}

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "folder for the runs, the GLUE data and results.json", required=True)
flags.DEFINE_float("flops", 7.2e11, "every arm's FLOP budget")
flags.DEFINE_integer("seeds", 3, "fine-tuning seeds per task")
flags.DEFINE_integer("probe_steps", 50, "MLM steps of the CLM arm's probe")
flags.DEFINE_list("arms", list(ARMS), "arms to run")


def bert_jax(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "bert_jax.cli", *args], cwd=ROOT, check=True,
                   env=dict(os.environ, JAX_PLATFORMS="cpu"))


def last_eval(workdir: str) -> dict:
    """The run's last eval row."""
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return next(row for row in reversed(rows) if any(key.startswith("eval/") for key in row))


def glue_dir(out: str) -> str:
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from test_evaluate import write_glue

    return write_glue(os.path.join(out, "glue"), n_train=1000, n_dev=500)


def run_arm(out: str, name: str, glue: str) -> dict:
    variant, overrides = ARMS[name]
    workdir = os.path.join(out, name)
    if not os.path.exists(os.path.join(workdir, "DONE")):
        bert_jax("pretrain", f"--config={CONFIG}:{variant}", f"--workdir={workdir}",
                 f"--config.train.budget={FLAGS.flops:g}flops", "--config.logging.plots=False", *overrides)
    trained = last_eval(workdir)
    judged = workdir
    if name == "clm":  # an MLM probe: the CLM arm has no MLM head trained
        judged = os.path.join(out, "clm_probe")
        if not os.path.exists(os.path.join(judged, "DONE")):
            step = trained["step"]
            bert_jax("pretrain", f"--config={CONFIG}:tiny", f"--workdir={judged}",
                     f"--config.branch_from={workdir}:{step}", f"--config.train.num_steps={step + FLAGS.probe_steps}",
                     "--config.logging.plots=False")
    probe = last_eval(judged)
    board_dir = os.path.join(out, f"{name}_smoke")
    if not os.path.exists(os.path.join(board_dir, "scoreboard.json")):
        bert_jax("evaluate", f"--checkpoint={judged}", "--suite=smoke", f"--glue_dir={glue}",
                 f"--seeds={FLAGS.seeds}", f"--out={board_dir}")
    with open(os.path.join(board_dir, "scoreboard.json")) as f:
        board = json.load(f)
    return {"arm": name, "steps": trained["step"], "eval": {k: v for k, v in trained.items() if k.startswith("eval/")},
            "eval_mlm_loss": probe.get("eval/mlm_loss", probe.get("eval/loss")),
            "sst2": board["tasks"]["sst2"]["median"], "stsb": board["tasks"]["stsb"]["median"], "board": board}


def main(argv) -> None:
    del argv
    os.makedirs(FLAGS.out, exist_ok=True)
    glue = glue_dir(FLAGS.out)
    results = [run_arm(FLAGS.out, name, glue) for name in FLAGS.arms]
    with open(os.path.join(FLAGS.out, "results.json"), "w") as f:
        json.dump({"flops": FLAGS.flops, "seeds": FLAGS.seeds, "arms": results}, f, indent=1)
    print(f"| arm | steps | eval MLM loss (clm: after a {FLAGS.probe_steps}-step MLM probe) | SST-2 accuracy, median "
          f"of {FLAGS.seeds} | STS-B Spearman, median |\n|---|---|---|---|---|")
    for r in results:
        print(f"| {r['arm']} | {r['steps']} | {r['eval_mlm_loss']:.3f} | {r['sst2']:.3f} | {r['stsb']:.3f} |")


if __name__ == "__main__":
    app.run(main)
