"""Does bert_jax train like transformers? One MLM recipe both ways, seeds interleaved, one evaluator.

    python bench/convergence_vs_transformers.py --out=/tmp/convergence [--steps=320] [--eval_at=40,80,160,320]

The recipe (RECIPE below): RoBERTa, 2 layers x 128, a WordPiece vocabulary of 8192 trained once on the
embedded corpus and shared by every run, FULL-SENTENCES rows of 128 tokens, batch 32, AdamW (b1 0.9,
b2 0.98, eps 1e-6, weight decay 0.01 on everything but biases and LayerNorm scales), gradient clipping at
1.0, linear warmup then linear decay to 0, float32, dropout off, 15 % masking, 80/10/10.

  bert_jax      `python -m bert_jax.pretrain --config=configs/roberta_base.py` with RECIPE's overrides:
                its own init, rows, masking (data_pipelines/loader/masking.py), step and optimizer; the
                checkpoints at --eval_at are exported with `bert_jax.export`'s library function.
  transformers  `RobertaForMaskedLM` from the same config.json, its own init, `torch.optim.AdamW` with the
                same decay mask, betas, eps and clipping, `get_linear_schedule_with_warmup`, and
                `DataCollatorForLanguageModeling` masking the same unmasked rows (bert_jax's FULL-SENTENCES
                rows of that seed: the rows are the same, the masks are each side's own). The MLM head
                scores only the selected positions: the same loss and gradients as scoring every position
                with labels of -100, four times cheaper on a CPU.

Every run (both sides of every seed) trains at once, one process and one thread each, so a machine's
changing load falls on all of them alike. One evaluator (`evaluate`, torch) then scores every saved model on one fixed
masked set: the held-out rows (the documents bert_jax's split holds out), masked --eval_maskings times by
the collator with fixed seeds. It prints a markdown table (mean and per-seed cross-entropy and accuracy per
side and step, the seed spread) and writes OUT/results.json and OUT/convergence.png.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "folder for the runs, the eval set, results.json and convergence.png", required=True)
flags.DEFINE_integer("steps", 320, "training steps per run")
flags.DEFINE_list("eval_at", ["40", "80", "160", "320"], "steps at which both sides are scored")
flags.DEFINE_list("seeds", ["0", "1"], "seeds; each runs both sides")
flags.DEFINE_float("learning_rate", 2e-3, "peak learning rate")
flags.DEFINE_integer("warmup_steps", 32, "linear warmup steps")
flags.DEFINE_integer("eval_maskings", 8, "maskings of the held-out rows in the fixed eval set")
flags.DEFINE_bool("score_only", False, "score the runs already in --out at the --eval_at steps they reached, "
                  "exporting bert_jax's kept checkpoints first; trains nothing (a run cut short still gives its curve)")
flags.DEFINE_enum("side", "", ["", "bert_jax", "transformers"], "internal: run one side of one seed")
flags.DEFINE_integer("seed", 0, "internal: the seed of --side")

# The recipe, as overrides of configs/roberta_base.py (RoBERTa's b2 0.98, eps 1e-6, weight decay 0.01).
RECIPE = {
    "model.vocab_size": 8192, "model.hidden_size": 128, "model.num_layers": 2, "model.num_heads": 2,
    "model.intermediate_size": 512, "model.max_position_embeddings": 130, "model.pad_token_id": 0,
    "model.dtype": "float32", "model.scan_layers": False, "model.dropout_rate": 0.0,
    "model.attention_dropout_rate": 0.0,
    "data.tokenizer.kind": "wordpiece", "data.max_seq_length": 128, "data.worker_count": 0,
    "data.num_eval_batches": 3,
    "train.global_batch_size": 32,
}
CONFIG_FILE = "configs/roberta_base.py"


def recipe(out: str, seed: int) -> dict:
    """RECIPE plus what the flags set: the schedule, checkpoints kept at every eval step, the shared tokenizer."""
    steps = [int(s) for s in FLAGS.eval_at]
    every = int(np.gcd.reduce(steps))
    return {**RECIPE, "data.tokenizer.path": os.path.join(out, "tokenizer"), "seed": seed,
            "train.num_steps": FLAGS.steps, "train.learning_rate": FLAGS.learning_rate,
            "train.warmup_steps": FLAGS.warmup_steps, "train.log_every_steps": every,
            "train.eval_every_steps": FLAGS.steps, "checkpoint.every_steps": every,
            "checkpoint.keep_every_steps": every}


def resolved_config(overrides: dict):
    """configs/roberta_base.py with `overrides`, as the pretrain command would resolve it."""
    from bert_jax.configs import roberta_base

    config = roberta_base.get_config()
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for name in parents:
            node = node[name]
        node[leaf] = value
    return config.copy_and_resolve_references()


def unmasked(batch: dict) -> np.ndarray:
    """[B, L] the rows before masking: input_ids with the masked positions' originals put back."""
    ids = batch["input_ids"].copy()
    rows, slots = np.nonzero(batch["masked_weights"])
    ids[rows, batch["masked_positions"][rows, slots]] = batch["masked_ids"][rows, slots]
    return ids


# ------------------------------------------------------------------------------------------------------------
# The two sides.
# ------------------------------------------------------------------------------------------------------------
def bert_jax_side(out: str, seed: int) -> None:
    """The real pretrain command, then each kept checkpoint at an eval step exported to a Hugging Face folder."""
    from bert_jax.train import export

    workdir = os.path.join(out, f"bert_jax_s{seed}")
    overrides = [f"--config.{key}={value}" for key, value in recipe(out, seed).items()]
    command = [sys.executable, "-m", "bert_jax.pretrain", f"--config={CONFIG_FILE}", f"--workdir={workdir}",
               *overrides]
    with open(os.path.join(out, f"bert_jax_s{seed}.log"), "w") as log:
        subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
    for step in FLAGS.eval_at:
        export.export(workdir, os.path.join(workdir, f"hf_{step}"), step=int(step))


def transformers_side(out: str, seed: int) -> None:
    """RobertaForMaskedLM + torch AdamW + DataCollatorForLanguageModeling on bert_jax's unmasked rows."""
    import torch
    import transformers

    from bert_jax.hf import roberta as hf_roberta
    from data_pipelines.loader import pipeline
    from data_pipelines.tokenizers import tokenizer as tokenizer_lib

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    config = resolved_config(recipe(out, seed))
    train = config.train
    model = transformers.RobertaForMaskedLM(transformers.RobertaConfig(**hf_roberta.hf_config(config.model)))
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n or "layer_norm" in n]
    decay = [p for n, p in model.named_parameters() if all(p is not q for q in no_decay)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": train.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=train.learning_rate, betas=(train.b1, train.b2), eps=train.eps)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, train.warmup_steps, train.num_steps)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(config.data.tokenizer.path)
    collator = transformers.DataCollatorForLanguageModeling(hf_tokenizer, mlm_probability=config.data.mask_rate,
                                                            seed=seed)
    tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer.path)
    rows = pipeline.build_train_iterator(config.data, tokenizer, seed=seed, per_host_batch_size=train.global_batch_size)
    pad = tokenizer_lib.special_ids(tokenizer).pad
    eval_at = {int(s) for s in FLAGS.eval_at}
    log = open(os.path.join(out, f"transformers_s{seed}.log"), "w")
    model.train()
    for step in range(1, train.num_steps + 1):
        ids = unmasked(next(rows))
        batch = collator([{"input_ids": row.tolist()} for row in ids])
        labels = batch["labels"]
        hidden = model.roberta(input_ids=batch["input_ids"],
                               attention_mask=torch.as_tensor(ids != pad, dtype=torch.long)).last_hidden_state
        selected = labels != -100
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[selected]), labels[selected])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % train.log_every_steps == 0:
            print(json.dumps({"step": step, "train/loss": loss.item()}), file=log, flush=True)
        if step in eval_at:
            model.save_pretrained(os.path.join(out, f"transformers_s{seed}", f"hf_{step}"))


# ------------------------------------------------------------------------------------------------------------
# One evaluator.
# ------------------------------------------------------------------------------------------------------------
def make_eval_set(out: str) -> dict:
    """The held-out rows (bert_jax's eval split), each masked --eval_maskings times by the collator; fixed."""
    import torch
    import transformers

    from data_pipelines.loader import pipeline
    from data_pipelines.tokenizers import tokenizer as tokenizer_lib

    config = resolved_config(recipe(out, 0))
    tokenizer = tokenizer_lib.load_tokenizer(config.data.tokenizer.path)
    batches = pipeline.build_eval_batches(config.data, tokenizer, seed=0,
                                          per_host_batch_size=config.train.global_batch_size)
    rows = np.concatenate([unmasked(b) for b in batches])
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(config.data.tokenizer.path)
    inputs, labels = [], []
    for masking in range(FLAGS.eval_maskings):
        collator = transformers.DataCollatorForLanguageModeling(hf_tokenizer, mlm_probability=config.data.mask_rate,
                                                                seed=10_000 + masking)
        batch = collator([{"input_ids": row.tolist()} for row in rows])
        inputs.append(batch["input_ids"].numpy())
        labels.append(batch["labels"].numpy())
    pad = tokenizer_lib.special_ids(tokenizer).pad
    eval_set = {"input_ids": np.concatenate(inputs), "labels": np.concatenate(labels),
                "attention_mask": np.concatenate([rows != pad] * FLAGS.eval_maskings).astype(np.int64)}
    del torch
    return eval_set


def evaluate(folder: str, eval_set: dict, batch_size: int = 64) -> dict:
    """Mean MLM cross-entropy (nats) and accuracy over the set's masked tokens, of a Hugging Face folder."""
    import torch
    import transformers

    model = transformers.AutoModelForMaskedLM.from_pretrained(folder, dtype=torch.float32).eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, len(eval_set["labels"]), batch_size):
            part = {k: torch.as_tensor(v[start : start + batch_size]) for k, v in eval_set.items()}
            labels = part.pop("labels")
            logits = model(**part).logits
            selected = labels != -100
            picked = logits[selected]
            loss_sum += torch.nn.functional.cross_entropy(picked, labels[selected], reduction="sum").item()
            correct += (picked.argmax(-1) == labels[selected]).sum().item()
            count += int(selected.sum())
    return {"loss": loss_sum / count, "accuracy": correct / count, "tokens": count}


# ------------------------------------------------------------------------------------------------------------
# The run: tokenizer, seeds side by side, scores, table and curves.
# ------------------------------------------------------------------------------------------------------------
def _spawn(out: str, side: str, seed: int) -> subprocess.Popen:
    argv = [sys.executable, os.path.abspath(__file__), f"--out={out}", f"--side={side}", f"--seed={seed}",
            f"--steps={FLAGS.steps}", f"--eval_at={','.join(FLAGS.eval_at)}",
            f"--learning_rate={FLAGS.learning_rate}", f"--warmup_steps={FLAGS.warmup_steps}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    return subprocess.Popen(argv, cwd=ROOT, env=env)


def table(results: dict, seeds: list[int]) -> str:
    """Markdown: per step and side, the mean over seeds and each seed's value, for loss and accuracy."""
    lines = ["| step | metric | bert_jax mean | bert_jax seeds | transformers mean | transformers seeds | "
             "difference | seed spread |", "|---|---|---|---|---|---|---|---|"]
    for step in FLAGS.eval_at:
        for metric, scale, unit in (("loss", 1.0, "nats"), ("accuracy", 100.0, "%")):
            per_side = {side: [results[side][str(seed)][step][metric] * scale for seed in seeds]
                        for side in ("bert_jax", "transformers")}
            spread = max(max(v) - min(v) for v in per_side.values())
            diff = np.mean(per_side["bert_jax"]) - np.mean(per_side["transformers"])
            lines.append(f"| {step} | {metric} ({unit}) | {np.mean(per_side['bert_jax']):.3f} | "
                         f"{', '.join(f'{v:.3f}' for v in per_side['bert_jax'])} | "
                         f"{np.mean(per_side['transformers']):.3f} | "
                         f"{', '.join(f'{v:.3f}' for v in per_side['transformers'])} | {diff:+.3f} | {spread:.3f} |")
    return "\n".join(lines)


def plot(results: dict, seeds: list[int], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [int(s) for s in FLAGS.eval_at]
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for side, color in (("bert_jax", "tab:blue"), ("transformers", "tab:orange")):
        for seed in seeds:
            for axis, metric in zip(axes, ("loss", "accuracy")):
                axis.plot(steps, [results[side][str(seed)][str(s)][metric] for s in steps], marker="o", color=color,
                          alpha=0.8, label=f"{side} seed {seed}", linestyle="-" if seed == seeds[0] else "--")
    for axis, label in zip(axes, ("held-out MLM cross-entropy (nats)", "held-out masked-token accuracy")):
        axis.set_xlabel("step")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def _main(argv) -> None:
    del argv
    out = os.path.abspath(FLAGS.out)
    if FLAGS.side:
        (bert_jax_side if FLAGS.side == "bert_jax" else transformers_side)(out, FLAGS.seed)
        return
    from data_pipelines.tokenizers import tokenizer as tokenizer_lib

    os.makedirs(out, exist_ok=True)
    if any(int(s) > FLAGS.steps for s in FLAGS.eval_at):
        raise SystemExit(f"--eval_at={','.join(FLAGS.eval_at)} has a step past --steps={FLAGS.steps}")
    seeds = [int(s) for s in FLAGS.seeds]
    config = resolved_config(recipe(out, 0))
    tokenizer_dir, config.data.tokenizer.path = config.data.tokenizer.path, ""
    tokenizer_lib.prepare_tokenizer(config.data, tokenizer_dir)  # Trained once: one vocabulary for every run.
    if FLAGS.score_only:
        score(out, seeds, {})
        return
    start = time.perf_counter()
    children = {(side, seed): _spawn(out, side, seed) for seed in seeds for side in ("bert_jax", "transformers")}
    walls = {}
    for (side, seed), child in children.items():  # Every run at once: a machine's load falls on all alike.
        if child.wait() != 0:
            for other in children.values():
                other.kill()
            raise RuntimeError(f"the {side} side of seed {seed} failed; see {out}/{side}_s{seed}.log")
        walls[f"{side}_s{seed}"] = time.perf_counter() - start
    print(f"all runs trained in {max(walls.values()):.0f} s", flush=True)
    score(out, seeds, walls)


def reached_steps(out: str, seeds: list[int]) -> list[str]:
    """The --eval_at steps every run has a model for (bert_jax's kept checkpoints are exported here if need be)."""
    from bert_jax.train import export

    steps = []
    for step in FLAGS.eval_at:
        for seed in seeds:
            workdir = os.path.join(out, f"bert_jax_s{seed}")
            folder = os.path.join(workdir, f"hf_{step}")
            if not os.path.exists(folder) and os.path.exists(os.path.join(workdir, "checkpoints", step)):
                export.export(workdir, folder, step=int(step))
        if all(os.path.exists(os.path.join(out, f"{side}_s{seed}", f"hf_{step}", "config.json"))
               for seed in seeds for side in ("bert_jax", "transformers")):
            steps.append(step)
    return steps


def score(out: str, seeds: list[int], walls: dict) -> None:
    """One evaluator over every run's models; results.json, convergence.png and the table."""
    FLAGS.eval_at = reached_steps(out, seeds)
    eval_set = make_eval_set(out)
    results = {side: {str(seed): {step: evaluate(os.path.join(out, f"{side}_s{seed}", f"hf_{step}"), eval_set)
                                  for step in FLAGS.eval_at} for seed in seeds}
               for side in ("bert_jax", "transformers")}
    summary = {"recipe": recipe(out, 0), "config_file": CONFIG_FILE, "eval_rows": len(eval_set["labels"]),
               "eval_tokens": int((eval_set["labels"] != -100).sum()), "wall_s": walls, "results": results}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    plot(results, seeds, os.path.join(out, "convergence.png"))
    print(f"eval set: {summary['eval_rows']} masked rows, {summary['eval_tokens']} masked tokens")
    print(table(results, seeds))


if __name__ == "__main__":
    app.run(_main)
