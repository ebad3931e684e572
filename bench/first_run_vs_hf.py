"""The first-run race: one recipe in three frameworks, and Hugging Face's own recipes, one evaluator (issue 75).

    python bench/first_run_vs_hf.py --out=/tmp/race --minutes=8 \\
        --sides=bert_jax,torch_crammed,torch_crammed_compile [--seeds=0,1] [--hf_flax_python=/tmp/hf457/bin/python]

Every side pre-trains on the embedded corpus's training split with one WordPiece tokenizer, trained once up front as
README (a)'s config trains it, for at most --minutes of wall-clock time counted from the moment its process is
started (imports, data, compiles and start-up included), one side at a time, once per seed, the order rotated from
seed to seed so that a machine's changing load falls on each. The sides:

  bert_jax               README (a)'s command, `bert-jax pretrain --config=configs/first_run.py` (--config), with the
                         shared tokenizer and --config.seed; a checkpoint kept every tenth of its steps. Its clock
                         is the moment its log line for a step arrives: the line is written once the step's
                         metrics are on the host. A run not DONE at the deadline gets SIGTERM.
  torch_crammed          the same recipe in transformers + torch, eager (bench/torch_crammed.py): ModernBertForMaskedLM
                         of the same shape with sparse prediction, bert_jax's own batches for the seed (rows, document
                         masks, positions and masks), AdamW with the same settings and the same one-cycle rate, step
                         by step, the same batch and steps.
  torch_crammed_compile  the same under torch.compile (its compile inside its minutes).
  hf_flax, transformers  Hugging Face's BERT recipes (run_mlm_flax's and run_mlm's, bench/hf_bert_sides.py): another
                         recipe (a post-LN BERT with dropout that predicts every position, --hf_config's shape), at the
                         batch and learning rate the first-run screen found best for it (--hf_batch_size, 16).

One evaluator (`evaluate`, PyTorch, transformers 5) scores every side at fixed points, every tenth of its steps and
its last, on one fixed masked set: the held-out documents (bert_jax's split of the embedded corpus), tokenised and
concatenated into rows of max_seq_length as `group_texts` does, masked --eval_maskings times by
DataCollatorForLanguageModeling with fixed seeds: the same masked positions for every side. Each checkpoint carries
the side's seconds when its step finished (saving excluded). Printed, and written to OUT/results.json (`runs`, one per
side and seed; `summary`, one per side) and OUT/races.md: time to --target eval MLM accuracy (the first scored
checkpoint at or above it), accuracy at equal steps (mean and spread over seeds), steps per second.
"""
from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_bert_sides  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = ("bert_jax", "torch_crammed", "torch_crammed_compile", "hf_flax", "transformers")
SAME_RECIPE = ("bert_jax", "torch_crammed", "torch_crammed_compile")
CHECKPOINTS = 10  # scored every tenth of a side's steps

FLAGS = flags.FLAGS
flags.DEFINE_string("config", "configs/first_run.py", "the recipe: bert_jax's config, torch_crammed's too")
flags.DEFINE_string("hf_config", "configs/tiny.py", "the BERT-recipe sides' shape and optimizer settings")
flags.DEFINE_integer("hf_batch_size", 16, "the BERT-recipe sides' batch (the first-run screen's best for them)")
flags.DEFINE_string("out", None, "folder for the tokenizer, the data, the runs and results.json", required=True)
flags.DEFINE_float("minutes", 8.0, "wall-clock minutes at most per side, from its process's start")
flags.DEFINE_list("seeds", ["0", "1"], "seeds; every side runs once per seed")
flags.DEFINE_list("sides", list(SAME_RECIPE), f"sides to run, of {SIDES}")
flags.DEFINE_float("target", 0.30, "the eval MLM accuracy whose time-to-quality is reported")
flags.DEFINE_string("hf_flax_python", "/tmp/hf457/bin/python", "a python with transformers 4.57.6 (Flax models)")
flags.DEFINE_integer("eval_maskings", 4, "maskings of the held-out rows in the fixed eval set")
flags.DEFINE_float("torch_init_scale", 1.0, "torch_crammed's initial matrices times this (1 / 0.8796: the std "
                   "jax's truncated normal gives, bench/torch_crammed.py)")
flags.DEFINE_bool("score_only", False, "score the runs already in --out; trains nothing")
flags.DEFINE_string("side", "", "internal: train one side in this process")
flags.DEFINE_string("run_dir", "", "internal: the side's folder")
flags.DEFINE_integer("seed", 0, "internal: the side's seed")
flags.DEFINE_float("started", 0.0, "internal: the time.time() at which the side's process was started")
flags.DEFINE_float("deadline", 0.0, "internal: the time.time() at which the side stops")


# ------------------------------------------------------------------------------------------------------------
# What every side shares: the tokenizer, the texts of the two splits, each recipe's numbers.
# ------------------------------------------------------------------------------------------------------------
def resolved_config(config_file: str, overrides: dict | None = None):
    from bert_jax.launch import sweep

    return sweep.resolved_config(config_file, overrides or {}).copy_and_resolve_references()


def prepare(out: str) -> dict:
    """OUT/tokenizer (trained as --config trains it), OUT/texts.json (both splits' documents as text) and
    OUT/recipe.json: `crammed`, --config's numbers for torch_crammed (the HF config bert_jax's export writes, the
    learning rate of every step from bert_jax's own schedule); `bert`, --hf_config's for the BERT-recipe sides."""
    from bert_jax.hf import modernbert
    from bert_jax.train import optimizer
    from data_pipelines.sources import corpus

    tokenizer = os.path.join(out, "tokenizer")
    if not os.path.isdir(tokenizer):
        subprocess.run([sys.executable, "-m", "bert_jax.commands.tokenizer", f"--config={FLAGS.config}",
                        f"--out={tokenizer}"], cwd=ROOT, check=True)
    config = resolved_config(FLAGS.config, {"data.tokenizer.path": tokenizer})
    hf_config = resolved_config(FLAGS.hf_config)
    split = {"train": [], "eval": []}
    for index, document in enumerate(corpus.embedded_documents()):
        held_out = corpus.is_eval_document(index, config.data.eval_fraction)
        split["eval" if held_out else "train"].append(" ".join(document))
    with open(os.path.join(out, "texts.json"), "w") as f:
        json.dump(split, f)
    t, steps = config.train, config.train.num_steps
    schedule = optimizer.learning_rate_schedule(t)
    crammed = dict(hf_config=modernbert.hf_config(config.model), lrs=np.asarray(schedule(np.arange(steps))).tolist(),
                   b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay, max_grad_norm=t.max_grad_norm,
                   batch_size=t.global_batch_size, eval_every=steps // CHECKPOINTS, log_every=steps // 60)
    m, h = hf_config.model, hf_config.train
    bert = dict(tokenizer=tokenizer, vocab_size=config.model.vocab_size, hidden_size=m.hidden_size,
                num_layers=m.num_layers, num_heads=m.num_heads, intermediate_size=m.intermediate_size,
                max_position_embeddings=m.max_position_embeddings, dropout=m.dropout_rate,
                max_seq_length=config.data.max_seq_length, mask_rate=config.data.mask_rate,
                batch_size=FLAGS.hf_batch_size, learning_rate=h.learning_rate, warmup_steps=h.warmup_steps,
                b1=h.b1, b2=h.b2, eps=h.eps, weight_decay=h.weight_decay, max_grad_norm=h.max_grad_norm)
    recipe = {"tokenizer": tokenizer, "num_steps": steps, "crammed": crammed, "bert": bert}
    with open(os.path.join(out, "recipe.json"), "w") as f:
        json.dump(recipe, f, indent=1)
    return recipe


def dump_batches(out: str, seed: int, num_steps: int) -> str:
    """OUT/batches_<seed>.npz: the first `num_steps` batches bert_jax's pipeline gives a run of --config with this
    seed (its train iterator, as train/loop.py builds it for a run's first stage), for torch_crammed."""
    from bert_jax.train import branch
    from data_pipelines.loader import pipeline
    from data_pipelines.tokenizers.tokenizer import load_tokenizer

    path = os.path.join(out, f"batches_{seed}.npz")
    if os.path.exists(path):
        return path
    tokenizer_dir = os.path.join(out, "tokenizer")
    config = resolved_config(FLAGS.config, {"data.tokenizer.path": tokenizer_dir, "seed": seed})
    data_seed, first_step = branch.iterator_origin(config, None)  # the loop's own choice for a run's first stage
    iterator = pipeline.build_train_iterator(config.data, load_tokenizer(tokenizer_dir), seed=data_seed,
                                             first_step=first_step, per_host_batch_size=config.train.global_batch_size)
    batches = [next(iterator) for _ in range(num_steps)]
    keys = ("input_ids", "position_ids", "segment_ids", "masked_positions", "masked_ids", "masked_weights")
    np.savez(path, **{key: np.stack([b[key] for b in batches]) for key in keys})
    return path


# ------------------------------------------------------------------------------------------------------------
# The sides, each in a process of its own.
# ------------------------------------------------------------------------------------------------------------
STEP_LINE = re.compile(r"\bstep (\d+)/(\d+) \|")


def bert_jax_side(out: str, run_dir: str, recipe: dict, seed: int, started: float, deadline: float) -> None:
    """README (a)'s command with the shared tokenizer and this seed; every step's log line timed as it arrives;
    the kept checkpoints exported for the evaluator once it is over (SIGTERM at the deadline)."""
    from bert_jax.storage.workdir import Workdir
    from bert_jax.train import export

    every, steps = recipe["crammed"]["eval_every"], recipe["num_steps"]
    command = [sys.executable, "-m", "bert_jax.pretrain", f"--config={FLAGS.config}", f"--workdir={run_dir}",
               f"--config.data.tokenizer.path={recipe['tokenizer']}", f"--config.seed={seed}",
               f"--config.checkpoint.every_steps={every}", f"--config.checkpoint.keep_every_steps={every}",
               f"--config.train.log_every_steps={recipe['crammed']['log_every']}", "--config.logging.plots=False"]
    arrived: dict[int, float] = {}
    with open(os.path.join(out, os.path.basename(run_dir) + ".log"), "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env=dict(os.environ, JAX_PLATFORMS="cpu"))

        def read() -> None:
            for line in process.stdout:
                now = time.time()
                log.write(line)
                match = STEP_LINE.search(line)
                if match:
                    arrived[int(match.group(1))] = now - started

        reader = threading.Thread(target=read)
        reader.start()
        try:
            process.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            stopped_at = time.time() - started
            process.send_signal(signal.SIGTERM)  # the run saves the step it is at and exits
            process.wait()
        else:
            stopped_at = None
        reader.join()
    saved, kept = [], Workdir(run_dir).checkpoint_steps()
    for step in kept:
        # Every tenth of the steps, timed by its log line; the step a SIGTERM saved, timed by the deadline.
        seconds = arrived.get(step) if step % every == 0 else stopped_at if step == max(kept) else None
        if seconds is not None:
            export.export(run_dir, os.path.join(run_dir, f"step_{step}"), step=step)
            saved.append({"step": step, "seconds": seconds})
    with open(os.path.join(run_dir, "side.json"), "w") as f:
        json.dump({"steps": max(kept, default=0), "checkpoints": saved,
                   "done": os.path.exists(os.path.join(run_dir, "DONE"))}, f)


def run_side(out: str, side: str, seed: int, recipe: dict) -> dict:
    """One side for one seed, at most --minutes; returns its record: steps, scored checkpoints, load averages."""
    run_dir = os.path.join(out, f"s{seed}_{side}")
    os.makedirs(run_dir, exist_ok=True)
    if side == "torch_crammed" or side == "torch_crammed_compile":
        dump_batches(out, seed, recipe["num_steps"])  # before its clock starts: the side's data costs it nothing
    load_before = os.getloadavg()
    started = time.time()
    deadline = started + 60 * FLAGS.minutes
    if side == "bert_jax":
        bert_jax_side(out, run_dir, recipe, seed, started, deadline)
    else:
        python = FLAGS.hf_flax_python if side == "hf_flax" else sys.executable
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
                   JAX_PLATFORMS="cpu")
        with open(os.path.join(out, f"s{seed}_{side}.log"), "w") as log:
            subprocess.run([python, os.path.abspath(__file__), f"--config={FLAGS.config}", f"--out={out}",
                            f"--side={side}", f"--run_dir={run_dir}", f"--seed={seed}", f"--started={started}",
                            f"--deadline={deadline}", f"--torch_init_scale={FLAGS.torch_init_scale}"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                           check=True)
    with open(os.path.join(run_dir, "side.json")) as f:
        trained = json.load(f)
    return {"side": side, "seed": seed, "wall_s": time.time() - started, "load_before": load_before[0],
            "load_after": os.getloadavg()[0], **trained}


def train_one_side(side: str, run_dir: str, seed: int, started: float, deadline: float) -> None:
    """The child process of run_side."""
    with open(os.path.join(os.path.dirname(run_dir), "recipe.json")) as f:
        recipe = json.load(f)
    if side in ("torch_crammed", "torch_crammed_compile"):
        import torch_crammed

        batches = os.path.join(os.path.dirname(run_dir), f"batches_{seed}.npz")
        return torch_crammed.train(run_dir, recipe["crammed"], batches, started, deadline, seed,
                                   compiled=side == "torch_crammed_compile", init_scale=FLAGS.torch_init_scale)
    train = hf_bert_sides.hf_flax_side if side == "hf_flax" else hf_bert_sides.transformers_side
    return train(run_dir, recipe["bert"], started, deadline, seed)


# ------------------------------------------------------------------------------------------------------------
# One evaluator.
# ------------------------------------------------------------------------------------------------------------
def make_eval_set(out: str, recipe: dict) -> dict:
    """The held-out documents as group_texts rows, each masked --eval_maskings times by the collator; fixed."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(recipe["tokenizer"])
    with open(os.path.join(out, "texts.json")) as f:
        rows = hf_bert_sides.grouped_rows(json.load(f)["eval"], tokenizer, recipe["bert"]["max_seq_length"])
    inputs, labels = [], []
    for masking in range(FLAGS.eval_maskings):
        collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, seed=10_000 + masking)
        batch = collator([{"input_ids": row.tolist()} for row in rows])
        inputs.append(batch["input_ids"].numpy())
        labels.append(batch["labels"].numpy())
    ids = np.concatenate(inputs)
    return {"input_ids": ids, "labels": np.concatenate(labels), "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids)}


def evaluate(folder: str, eval_set: dict, batch_size: int = 64) -> dict:
    """Mean MLM cross-entropy (nats) and accuracy over the set's masked tokens, of a Hugging Face folder (token
    types only for a model that takes them)."""
    import torch
    import transformers

    model = transformers.AutoModelForMaskedLM.from_pretrained(folder, dtype=torch.float32).eval()
    keys = ["input_ids", "attention_mask"] + (["token_type_ids"] if getattr(model.config, "type_vocab_size", 0)
                                              else [])
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(eval_set["labels"]), batch_size):
            part = {k: torch.as_tensor(eval_set[k][start : start + batch_size]) for k in keys}
            labels = torch.as_tensor(eval_set["labels"][start : start + batch_size])
            logits = model(**part).logits
            selected = labels != -100
            picked = logits[selected]
            loss_sum += torch.nn.functional.cross_entropy(picked, labels[selected], reduction="sum").item()
            correct += (picked.argmax(-1) == labels[selected]).sum().item()
            count += int(selected.sum())
    return {"loss": loss_sum / count, "accuracy": correct / count, "tokens": count}


def score(run: dict, run_dir: str, eval_set: dict, target: float) -> dict:
    """The run's checkpoints scored; its time to `target` (None: not reached) and steps per second between its first
    and last scored checkpoints (start-up and compile apart)."""
    for point in run["checkpoints"]:
        point.update(evaluate(os.path.join(run_dir, f"step_{point['step']}"), eval_set))
    points = run["checkpoints"]
    reached = next((p for p in points if p["accuracy"] >= target), None)
    first, last = (points[0], points[-1]) if points else ({}, {})
    rate = (last["step"] - first["step"]) / (last["seconds"] - first["seconds"]) if len(points) > 1 else None
    return {**run, "time_to_target_s": reached and reached["seconds"], "steps_per_s": rate,
            "final": last and {k: last[k] for k in ("step", "seconds", "loss", "accuracy")},
            "folder": last and os.path.join(run_dir, f"step_{last['step']}")}


# ------------------------------------------------------------------------------------------------------------
# Tables.
# ------------------------------------------------------------------------------------------------------------
def summary(runs: list[dict]) -> dict:
    """Per side over seeds: time to target (median; None if a seed missed it), final accuracy, steps per second."""
    sides = {}
    for side in dict.fromkeys(r["side"] for r in runs):
        mine = [r for r in runs if r["side"] == side]
        times = [r["time_to_target_s"] for r in mine]
        sides[side] = {"seeds": [r["seed"] for r in mine],
                       "time_to_target_s": times,
                       "median_time_to_target_s": None if None in times else statistics.median(times),
                       "final_accuracy": [r["final"]["accuracy"] for r in mine if r["final"]],
                       "steps": [r["steps"] for r in mine],
                       "steps_per_s": statistics.median([r["steps_per_s"] for r in mine if r["steps_per_s"]] or [0])}
    return sides


def _seconds(value) -> str:
    return "not reached" if value is None else f"{value:.0f}"


def tables(runs: list[dict], sides: dict, target: float) -> str:
    """Markdown: time to target per side (with ratios to bert_jax), then accuracy at equal steps."""
    lines = [f"| side | seeds | time to {target:.2f} (s), each seed | median | steps | steps/s | final eval MLM "
             "accuracy, each seed | bert_jax's time / this side's |", "|---|---|---|---|---|---|---|---|"]
    ours = sides.get("bert_jax", {}).get("median_time_to_target_s")
    for side, s in sides.items():
        theirs = s["median_time_to_target_s"]
        ratio = f"{ours / theirs:.2f}" if ours and theirs else "-"
        lines.append(f"| {side} | {', '.join(map(str, s['seeds']))} | "
                     f"{', '.join(_seconds(t) for t in s['time_to_target_s'])} | {_seconds(theirs)} | "
                     f"{', '.join(map(str, s['steps']))} | {s['steps_per_s']:.2f} | "
                     f"{', '.join(f'{a:.4f}' for a in s['final_accuracy'])} | {ratio} |")
    steps = sorted({p["step"] for r in runs if r["side"] in SAME_RECIPE for p in r["checkpoints"]})
    same = [side for side in sides if side in SAME_RECIPE]
    if steps and same:
        lines += ["", "Accuracy at equal steps (the same recipe; mean over seeds, +- half the seeds' range):", "",
                  "| step | " + " | ".join(same) + " |", "|---|" + "---|" * len(same)]
        for step in steps:
            cells = []
            for side in same:
                values = [p["accuracy"] for r in runs if r["side"] == side for p in r["checkpoints"]
                          if p["step"] == step]
                cells.append(f"{np.mean(values):.4f} +- {(max(values) - min(values)) / 2:.4f}" if values else "-")
            lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv) -> None:
    del argv
    if FLAGS.side:
        return train_one_side(FLAGS.side, FLAGS.run_dir, FLAGS.seed, FLAGS.started, FLAGS.deadline)
    unknown = [side for side in FLAGS.sides if side not in SIDES]
    if unknown:
        raise app.UsageError(f"--sides: unknown side {unknown[0]!r}; expected some of {', '.join(SIDES)}")
    os.makedirs(FLAGS.out, exist_ok=True)
    recipe = prepare(FLAGS.out)
    results_path = os.path.join(FLAGS.out, "results.json")
    if FLAGS.score_only:
        with open(results_path) as f:
            runs = json.load(f)["runs"]
    else:
        runs = []
        for i, seed in enumerate(int(s) for s in FLAGS.seeds):
            order = FLAGS.sides[i % len(FLAGS.sides):] + FLAGS.sides[: i % len(FLAGS.sides)]
            for side in order:
                runs.append(run_side(FLAGS.out, side, seed, recipe))
                print(json.dumps({k: v for k, v in runs[-1].items() if k != "log"}), flush=True)
    eval_set = make_eval_set(FLAGS.out, recipe)
    runs = [score(run, os.path.join(FLAGS.out, f"s{run['seed']}_{run['side']}"), eval_set, FLAGS.target)
            for run in runs]
    sides = summary(runs)
    with open(results_path, "w") as f:
        json.dump({"minutes": FLAGS.minutes, "target": FLAGS.target, "recipe": recipe, "summary": sides,
                   "runs": runs, "eval_tokens": int((eval_set["labels"] != -100).sum())}, f, indent=1)
    text = tables(runs, sides, FLAGS.target)
    with open(os.path.join(FLAGS.out, "races.md"), "w") as f:
        f.write(text + "\n")
    print(f"at most {FLAGS.minutes:g} minutes per side and seed; {len(eval_set['labels'])} held-out rows x maskings\n")
    print(text)


if __name__ == "__main__":
    app.run(main)
