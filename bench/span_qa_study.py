"""SpanBERT's ablation in miniature: span QA fine-tuned from tiny runs pre-trained at equal steps under token masking,
span masking, and span masking + the span boundary objective (docs/results/spanbert.md).

    python bench/span_qa_study.py --out=runs/span_qa_study [--steps=1200] [--seeds=3] [--pretrain_seeds=0,1,2]
        [--baseline]

Makes the span-recovery QA set from the embedded corpus (`write_span_recovery`), pre-trains one
configs/spanbert_base.py:tiny run per arm (same seed, data, model and steps; the arms differ by two overrides),
then runs `bert-jax evaluate --suite=configs/suites/span_recovery.py --seeds=N` on each and prints each
scoreboard's median F1 with its min-max over the fine-tuning seeds. `--pretrain_seeds` pre-trains each arm once per
seed; `--baseline` adds the same fine-tuning from the initialisation. Commands run one after another; a rerun keeps
finished pre-trainings (DONE) and finished fine-tunings, as the commands themselves do.
"""
import json
import random
import re
import subprocess
import sys
import zlib

from absl import app, flags

from bert_jax.storage import paths
from data_pipelines.sources import corpus

ARMS = {  # name -> overrides of configs/spanbert_base.py:tiny
    "token masking": ["--config.data.masking=token", "--config.model.sbo_loss_weight=0"],
    "span masking": ["--config.model.sbo_loss_weight=0"],
    "span masking + SBO": [],
}
# --baseline: the same fine-tuning from the initialisation (one step at learning rate 0, the warmup's first).
BASELINE = ("no pre-training", ["--config.train.warmup_steps=1"])
_WORD = re.compile(r"^[A-Za-z][A-Za-z'-]*[,;:.]?$")
SIDE = 3  # words of the question on each side of the span

_OUT = flags.DEFINE_string("out", None, "Folder for the data, the runs and the scoreboards.")
_STEPS = flags.DEFINE_integer("steps", 1200, "Pre-training steps of every arm.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Fine-tuning seeds per arm.")
_TRAIN = flags.DEFINE_integer("train", 2000, "Training questions.")
_DEV = flags.DEFINE_integer("dev", 400, "Dev questions.")
_PRETRAIN_SEEDS = flags.DEFINE_list("pretrain_seeds", ["0"], "Pre-training seeds of every arm (config.seed).")
_BASELINE = flags.DEFINE_bool("baseline", False, "Also fine-tune from the initialisation (no pre-training).")
flags.mark_flag_as_required("out")


def recovery_questions(rng: random.Random, dev: bool) -> list[dict]:
    """Every usable sentence (but a document's last) of the documents on one side of the split (a hash of the
    document's index, as the corpus splits), with the next sentence as a SQuAD paragraph with one question."""
    out = []
    for index, document in enumerate(corpus.embedded_documents()):
        if (zlib.crc32(index.to_bytes(8, "little")) < 0.2 * 2**32) != dev:
            continue
        for i in range(len(document) - 1):
            words = document[i].split()
            if not 2 * SIDE + 1 <= len(words) <= 30 or not all(_WORD.match(w) for w in words):
                continue
            length = rng.randint(1, 3)
            start = rng.randint(SIDE, max(SIDE, len(words) - SIDE - length))
            if start + length + SIDE > len(words):
                continue
            context = f"{document[i]} {document[i + 1]}"
            answer = " ".join(words[start:start + length])
            prefix = " ".join(words[:start])
            answer_start = len(prefix) + (1 if prefix else 0)
            if context[answer_start:answer_start + len(answer)] != answer:
                continue
            question = " ".join(words[start - SIDE:start] + ["?"] + words[start + length:start + length + SIDE])
            out.append({"context": context, "qas": [{"id": f"{'dev' if dev else 'train'}-{len(out)}",
                                                     "question": question, "is_impossible": False,
                                                     "answers": [{"text": answer, "answer_start": answer_start}]}]})
    return out


def write_span_recovery(folder: str, n_train: int, n_dev: int, seed: int = 0) -> None:
    """folder/SPAN-RECOVERY/{train,dev}.json (SQuAD v1.1 JSON): `n_train` and `n_dev` questions of disjoint
    documents, a seeded sample of all there are."""
    rng = random.Random(seed)
    for split, n, dev in (("train", n_train, False), ("dev", n_dev, True)):
        paragraphs = recovery_questions(rng, dev)
        if len(paragraphs) < n:
            sys.exit(f"--{split}={n}: the corpus gives {len(paragraphs)} questions on that side of the split")
        paragraphs = rng.sample(paragraphs, n)
        data = {"version": "1.1", "data": [{"title": "span recovery", "paragraphs": paragraphs}]}
        paths.write_atomically(paths.path(folder) / "SPAN-RECOVERY" / f"{split}.json", json.dumps(data))


def run(command: list[str]) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def main(argv) -> None:
    del argv
    out = paths.path(_OUT.value)
    data = out / "data"
    if not (data / "SPAN-RECOVERY" / "dev.json").exists():
        write_span_recovery(str(data), _TRAIN.value, _DEV.value)
    arms = [(arm, overrides, _STEPS.value) for arm, overrides in ARMS.items()]
    if _BASELINE.value:
        arms.append((*BASELINE, 1))
    rows = []
    for arm, overrides, steps in arms:
        for seed in map(int, _PRETRAIN_SEEDS.value):
            # Seed 0's run folder is the arm's name; another seed's adds _seed<N>.
            workdir = out / (arm.replace(" + ", "_").replace(" ", "_") + (f"_seed{seed}" if seed else ""))
            run(["bert-jax", "pretrain", "--config=configs/spanbert_base.py:tiny", f"--workdir={workdir}",
                 f"--config.seed={seed}", f"--config.train.num_steps={steps}", f"--config.checkpoint.every_steps={steps}",
                 f"--config.train.eval_every_steps={steps}", *overrides])
            board_dir = workdir / "span_qa"
            run(["bert-jax", "evaluate", f"--checkpoint={workdir}", "--suite=configs/suites/span_recovery.py",
                 f"--glue_dir={data}", f"--seeds={_SEEDS.value}", f"--out={board_dir}"])
            board = json.loads((board_dir / "scoreboard.json").read_text())
            last_eval = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()
                         if "eval/mlm_accuracy" in line][-1]
            rows.append((arm, seed, board["tasks"]["span_recovery"], last_eval))
    print("\n| arm | pre-training seed | span QA F1 x 100, median (min-max over fine-tuning seeds, n) | "
          "eval MLM accuracy | eval SBO loss |\n|---|---|---|---|---|")
    for arm, seed, t, last in rows:
        print(f"| {arm} | {seed} | {100 * t['median']:.1f} ({100 * t['min']:.1f}-{100 * t['max']:.1f}, {t['n']}) | "
              f"{last['eval/mlm_accuracy']:.4f} | {last['eval/sbo_loss']:.3f} |")


if __name__ == "__main__":
    app.run(main)
