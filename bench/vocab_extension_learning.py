"""Does FVT initialisation of a domain vocabulary help continued pre-training? Four runs, same steps and seed:

  base        a tiny BERT pre-trained on the embedded corpus (Python's documentation), exported;
  none        continued on the domain corpus with the original vocabulary;
  fvt         continued after extend-vocab --add=N --init=fvt (new rows: mean of their old pieces' rows);
  random      the same words, --init=random (new rows drawn as a fresh model's, biases 0);
  fvt_warmup  fvt with config.train.new_rows_warmup_steps (the new rows alone first).

The domain corpus is legal text: the licences Debian ships in /usr/share/common-licenses (GPL, LGPL,
Apache, MPL, Artistic, GFDL, CC0...), paragraphs as documents, 5% held out for eval by the pipeline's
usual split. The runs tokenize differently, so eval MLM loss is compared in bits per character:
eval/mlm_loss / ln 2 / (characters per token of the held-out text under the run's tokenizer). Step 0
is the imported model before any update (one step at learning rate 0).

    python bench/vocab_extension_learning.py --out=/tmp/vocab_bench [--steps=300 --add=256]

writes OUT/curves.json and OUT/table.md (the table of docs/results/guides.md).
"""
import argparse
import json
import math
import pathlib
import shutil
import sys
import time

import ml_collections

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bert_jax.train import export  # noqa: E402
from bert_jax.train.loop import train_and_evaluate  # noqa: E402
from bert_jax.vocab.extension import ExtendRequest, extend_vocab  # noqa: E402
from bert_jax.configs import tiny  # noqa: E402
from data_pipelines.sources import corpus, documents as sources  # noqa: E402
from data_pipelines.tokenizers.tokenizer import load_tokenizer  # noqa: E402

LICENCES = pathlib.Path("/usr/share/common-licenses")
RUNS = ("none", "fvt", "random", "fvt_warmup")


def micro_config(steps: int, eval_every: int, seed: int = 0):
    """configs/tiny.py at half its width and sequence length: minutes on 2 CPU cores."""
    c = tiny.get_config()
    c.seed = seed
    c.model.vocab_size = 2048
    c.model.hidden_size = 64
    c.model.intermediate_size = 256
    c.data.max_seq_length = 64
    c.data.max_predictions_per_seq = 10
    c.data.num_eval_batches = 8
    c.train.global_batch_size = 32
    c.train.num_steps = steps
    c.train.warmup_steps = max(steps // 10, 1)
    c.train.learning_rate = 2e-3
    c.train.log_every_steps = eval_every
    c.train.eval_every_steps = eval_every
    c.checkpoint.every_steps = steps
    return c


def domain_corpus(out: pathlib.Path) -> pathlib.Path:
    """The licences as one text file, paragraphs (blank-line separated) as documents."""
    if not LICENCES.is_dir():
        raise SystemExit(f"{LICENCES} is missing: the legal domain corpus comes from there")
    text = "\n\n".join(p.read_text(errors="replace") for p in sorted(LICENCES.iterdir()) if p.is_file())
    path = out / "licences.txt"
    path.write_text(text)
    return path


def chars_per_token(tokenizer_dir: str, data_cfg) -> float:
    """Characters per token of the held-out documents (the pipeline's eval split) under that tokenizer."""
    tokenizer = load_tokenizer(tokenizer_dir)
    chars = tokens = 0
    for index, document in enumerate(sources.iter_documents(data_cfg)):
        if corpus.is_eval_document(index, data_cfg.eval_fraction):
            chars += sum(len(s) for s in document)
            tokens += sum(len(ids) for ids in tokenizer.encode_ids(document))
    return chars / tokens


def eval_rows(workdir: pathlib.Path) -> list[dict]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval/loss" in r]


def compare(out: pathlib.Path, base_steps: int, steps: int, eval_every: int, add: int, warmup: int,
            learning_rate: float = 5e-4, runs=RUNS, step0: bool = True, stop_at: int | None = None) -> dict:
    """Trains the base model, extends it, continues each run (to `stop_at`, on the schedule of `steps`);
    returns {"curves": {run: [{step, mlm_loss, accuracy, bpc}]}, "report": extend-vocab's figures}."""
    out.mkdir(parents=True, exist_ok=True)
    text = domain_corpus(out)
    base_dir = out / "base"
    if not (base_dir / "DONE").exists():
        train_and_evaluate(micro_config(base_steps, base_steps), str(base_dir))
    base_hf = out / "base_hf"
    if not (base_hf / "config.json").exists():
        export.export(str(base_dir), str(base_hf))
    folders = {"none": base_hf}
    reports = {}
    for init in ("fvt", "random"):
        folder = out / f"extended_{init}"
        if not (folder / "config.json").exists():
            shutil.rmtree(folder, ignore_errors=True)
            extend_vocab(ExtendRequest(source=str(base_hf), corpus=str(text), out=str(folder), add=add, init=init))
        folders[init] = folders[f"{init}_warmup"] = folder
        reports[init] = json.loads((folder / "extend_vocab_report.json").read_text())
    curves = {}
    for run in runs:
        folder = folders[run]
        config = micro_config(steps, eval_every)
        config.train.learning_rate = learning_rate  # continued pre-training: below the base run's 2e-3
        config.init_from_hf = str(folder)
        config.model.vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
        config.data.source, config.data.path = "text", str(text)
        if run.endswith("_warmup"):
            config.train.new_rows_warmup_steps = warmup
            config.train.new_rows_start = reports["fvt"]["first_new_id"]
        # Step 0, before any training: one step at learning rate 0 leaves the params as imported.
        untrained = ml_collections.ConfigDict(config.to_dict())
        untrained.train.update(num_steps=1, learning_rate=0.0, end_learning_rate=0.0, warmup_steps=1,
                               eval_every_steps=1, log_every_steps=1)
        untrained.checkpoint.every_steps = 1
        rows = []
        stages = ((out / f"run_{run}_step0", untrained, None),) if step0 else ()
        for workdir, run_config, stop in (*stages, (out / f"run_{run}", config, stop_at)):
            if not (workdir / "DONE").exists():
                shutil.rmtree(workdir, ignore_errors=True)
                start = time.perf_counter()
                train_and_evaluate(run_config, str(workdir), stop_at_step=stop)
                print(f"{workdir.name}: {time.perf_counter() - start:.0f} s", flush=True)
            rows += [dict(r, step=0) if workdir.name.endswith("step0") else r for r in eval_rows(workdir)]
        cpt = chars_per_token(str(folder), config.data)
        curves[run] = [{"step": r["step"], "mlm_loss": r["eval/mlm_loss"], "accuracy": r["eval/mlm_accuracy"],
                        "bpc": r["eval/mlm_loss"] / math.log(2) / cpt, "chars_per_token": cpt} for r in rows]
    return {"curves": curves, "report": {k: {key: v[key] for key in ("tokens_per_word_before",
                                                                       "tokens_per_word_after", "first_new_id",
                                                                       "vocab_size")} for k, v in reports.items()}}


def table(result: dict) -> str:
    curves = result["curves"]
    steps = [point["step"] for point in next(iter(curves.values()))]
    lines = ["| eval step | " + " | ".join(f"{run} bpc (acc)" for run in curves) + " |",
             "|---|" + "---|" * len(curves)]
    for i, step in enumerate(steps):
        cells = [f"{curves[run][i]['bpc']:.3f} ({curves[run][i]['accuracy']:.3f})" for run in curves]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    fvt = result["report"]["fvt"]
    lines.append("")
    lines.append(f"tokens per word of the domain corpus: {fvt['tokens_per_word_before']:.3f} before, "
                 f"{fvt['tokens_per_word_after']:.3f} after extension (ids {fvt['first_new_id']}.."
                 f"{fvt['vocab_size'] - 1} new)")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--base_steps", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--eval_every", type=int, default=50)
    parser.add_argument("--add", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=50, help="new_rows_warmup_steps of the fvt_warmup run")
    parser.add_argument("--learning_rate", type=float, default=5e-4, help="of the continued runs")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    start = time.perf_counter()
    result = compare(out, args.base_steps, args.steps, args.eval_every, args.add, args.warmup, args.learning_rate)
    (out / "curves.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "table.md").write_text(table(result))
    print(table(result))
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
