"""The first run against Hugging Face's recipes: the same minutes on the same cores, one evaluator (issue 67).

    python bench/first_run_vs_hf.py --out=/tmp/first_run_vs_hf [--minutes=8] [--rounds=1] \\
        [--hf_flax_python=/tmp/hf457/bin/python]

Three sides pre-train on the embedded corpus's training split with one WordPiece tokenizer, trained once up front
as README (a)'s config trains it and given to all three, each for --minutes of wall-clock time counted from its
process's start (imports, data preparation and compiles included), one side at a time, the order rotated every round
(A B C, then B C A, ...) so that a machine's changing load falls on each:

  bert_jax      README (a)'s command, `bert-jax pretrain --config=configs/first_run.py` (--config), with the shared
                tokenizer and a checkpoint every 100 steps; a run not DONE at the deadline gets SIGTERM (it saves the
                step it is at) and its newest checkpoint is scored. Its step count is the config's (times
                --minutes / 8 when shortened).
  hf_flax       transformers' examples/flax/language-modeling/run_mlm_flax.py, its training step as written there:
                FlaxBertForMaskedLM, the documents tokenised and concatenated into rows of max_seq_length
                (`group_texts`), its FlaxDataCollatorForLanguageModeling's masking (80/10/10), the cross-entropy
                over the whole vocabulary at every position weighted by `labels > 0`, optax.adamw without weight decay
                on biases and LayerNorm scales, linear warmup then linear decay to 0. transformers 4.57.6 is the
                last release with Flax models and it cannot share the project's venv (transformers 5): it runs in
                its own venv, e.g. `python3 -m venv /tmp/hf457 && echo $PWD/.venv/lib/python3.11/site-packages >
                /tmp/hf457/lib/python3.11/site-packages/project.pth && /tmp/hf457/bin/pip install transformers==4.57.6`
                (its jax, flax, optax and torch are the project's). Its trained params are converted to a PyTorch
                folder there (transformers' load_flax_weights_in_pytorch_model) for the evaluator.
  transformers  the same with PyTorch (run_mlm.py's recipe): BertForMaskedLM on the same rows,
                DataCollatorForLanguageModeling, torch.optim.AdamW with the same decay mask, gradient clipping,
                get_linear_schedule_with_warmup's shape.

The Hugging Face sides are BERTs (post-LN, learned positions) of --hf_config's shape and optimizer settings
(configs/tiny.py: 2 x 128, 2 heads, feed-forward 512, peak learning rate 2e-3 with 50 warmup steps, Adam's betas
and eps, weight decay, clipping, batch 32), the values the screens found good for a post-LN BERT on this corpus
(5e-3 collapsed to the most frequent token; docs/results/first-run.md), at the shared tokenizer's vocabulary,
sequence length and mask rate. They do not know in advance how many steps fit: each times its steps 5 to 20 and
then fixes its schedule's length to fill 95 % of what is left of its minutes (the decay ends there); each also
stops at the deadline whatever happens.

One evaluator (`evaluate`, PyTorch, transformers 5) scores every side's final folder on one fixed masked set: the
held-out documents (bert_jax's split of the embedded corpus), tokenised and concatenated into rows of
max_seq_length as `group_texts` does, token type 0, masked --eval_maskings times by DataCollatorForLanguageModeling
with fixed seeds: the same masked positions for every side. It prints a markdown table (per side and round: steps,
seconds trained, eval MLM loss and accuracy, the load average while it trained) and writes OUT/results.json.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = ("bert_jax", "hf_flax", "transformers")

FLAGS = flags.FLAGS
flags.DEFINE_string("config", "configs/first_run.py", "bert_jax's side: README (a)'s config")
flags.DEFINE_string("hf_config", "configs/tiny.py", "the Hugging Face sides' BERT shape and optimizer settings")
flags.DEFINE_string("out", None, "folder for the tokenizer, the data, the runs and results.json", required=True)
flags.DEFINE_float("minutes", 8.0, "wall-clock minutes each side trains, from its process's start")
flags.DEFINE_integer("rounds", 1, "rounds of all sides, the order rotated each round")
flags.DEFINE_list("sides", list(SIDES), "sides to run")
flags.DEFINE_string("hf_flax_python", "/tmp/hf457/bin/python", "a python with transformers 4.57.6 (Flax models)")
flags.DEFINE_integer("eval_maskings", 4, "maskings of the held-out rows in the fixed eval set")
flags.DEFINE_bool("score_only", False, "score the runs already in --out; trains nothing")
flags.DEFINE_enum("side", "", ["", "hf_flax", "transformers"], "internal: train one Hugging Face side")
flags.DEFINE_string("run_dir", "", "internal: the side's folder")
flags.DEFINE_float("deadline", 0.0, "internal: the time.time() at which the side stops")


# ------------------------------------------------------------------------------------------------------------
# What every side shares: the recipe's numbers, the tokenizer, the texts of the two splits.
# ------------------------------------------------------------------------------------------------------------
def resolved_config(config_file: str):
    from bert_jax.launch import sweep

    return sweep.resolved_config(config_file, {}).copy_and_resolve_references()


def prepare(out: str) -> dict:
    """OUT/tokenizer (trained as --config trains it), OUT/texts.json (both splits' documents as text) and
    OUT/recipe.json (the numbers the Hugging Face sides take: --hf_config's, at the tokenizer's vocabulary)."""
    from data_pipelines.sources import corpus

    config, hf_config = resolved_config(FLAGS.config), resolved_config(FLAGS.hf_config)
    tokenizer = os.path.join(out, "tokenizer")
    if not os.path.isdir(tokenizer):
        subprocess.run([sys.executable, "-m", "bert_jax.commands.tokenizer", f"--config={FLAGS.config}",
                        f"--out={tokenizer}"], cwd=ROOT, check=True)
    split = {"train": [], "eval": []}
    for index, document in enumerate(corpus.embedded_documents()):
        held_out = corpus.is_eval_document(index, config.data.eval_fraction)
        split["eval" if held_out else "train"].append(" ".join(document))
    with open(os.path.join(out, "texts.json"), "w") as f:
        json.dump(split, f)
    m, t = hf_config.model, hf_config.train
    recipe = dict(tokenizer=tokenizer, vocab_size=config.model.vocab_size, hidden_size=m.hidden_size,
                  num_layers=m.num_layers, num_heads=m.num_heads, intermediate_size=m.intermediate_size,
                  max_position_embeddings=m.max_position_embeddings, dropout=m.dropout_rate,
                  max_seq_length=config.data.max_seq_length, mask_rate=config.data.mask_rate,
                  batch_size=t.global_batch_size, num_steps=config.train.num_steps, learning_rate=t.learning_rate,
                  warmup_steps=t.warmup_steps, b1=t.b1, b2=t.b2, eps=t.eps, weight_decay=t.weight_decay,
                  max_grad_norm=t.max_grad_norm)
    with open(os.path.join(out, "recipe.json"), "w") as f:
        json.dump(recipe, f, indent=1)
    return recipe


def grouped_rows(texts: list[str], tokenizer, length: int) -> np.ndarray:
    """[n, length] int64: run_mlm(_flax).py's `group_texts`: each text tokenised with its [CLS] and [SEP], all
    concatenated, cut into rows of `length`, the remainder dropped."""
    ids = [i for text in texts for i in tokenizer(text, verbose=False)["input_ids"]]
    n = len(ids) // length
    return np.asarray(ids[: n * length], np.int64).reshape(n, length)


def bert_config_kwargs(recipe: dict) -> dict:
    return dict(vocab_size=recipe["vocab_size"], hidden_size=recipe["hidden_size"],
                num_hidden_layers=recipe["num_layers"], num_attention_heads=recipe["num_heads"],
                intermediate_size=recipe["intermediate_size"],
                max_position_embeddings=recipe["max_position_embeddings"], hidden_dropout_prob=recipe["dropout"],
                attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12)


class StepBudget:
    """A Hugging Face side's schedule length: after timing steps 5..20 it fixes the count that fills 95 % of
    what is left before the deadline (at least the steps already taken + 1)."""

    def __init__(self, deadline: float, warmup_steps: int):
        self.deadline, self.warmup_steps, self.total, self._t5 = deadline, warmup_steps, None, None

    def learning_rate(self, step: int, peak: float) -> float:
        """Linear warmup to `peak`, then linear decay to 0 at the fixed total (warmup only until it is fixed)."""
        if step < self.warmup_steps or self.total is None:
            return peak * min(step, self.warmup_steps) / self.warmup_steps
        return peak * max(0.0, (self.total - step) / max(1, self.total - self.warmup_steps))

    def after_step(self, step: int) -> bool:
        """Records the step's end; False once the side must stop (its total reached, or the deadline)."""
        now = time.time()
        if step == 5:
            self._t5 = now
        if step == 20 and self.total is None:
            per_step = (now - self._t5) / 15
            self.total = max(step + 1, step + int(0.95 * (self.deadline - now) / per_step))
        return now < self.deadline and (self.total is None or step < self.total)


# ------------------------------------------------------------------------------------------------------------
# The sides.
# ------------------------------------------------------------------------------------------------------------
def hf_flax_side(run_dir: str, recipe: dict, deadline: float) -> None:
    """run_mlm_flax.py's training step on group_texts rows; runs under transformers 4.57.6."""
    import jax
    import jax.numpy as jnp
    import optax
    import transformers
    from flax import traverse_util
    from flax.training import train_state
    from flax.training.common_utils import onehot

    tokenizer = transformers.AutoTokenizer.from_pretrained(recipe["tokenizer"])
    with open(os.path.join(os.path.dirname(run_dir), "texts.json")) as f:
        rows = grouped_rows(json.load(f)["train"], tokenizer, recipe["max_seq_length"])
    config = transformers.BertConfig(**bert_config_kwargs(recipe))
    model = transformers.FlaxBertForMaskedLM(config, seed=0, dtype=jnp.float32)
    special = np.isin(rows, tokenizer.all_special_ids)
    np.random.seed(0)  # the script's collator draws from numpy's global generator

    def decay_mask_fn(params):  # as run_mlm_flax.py: no decay on biases and LayerNorm scales
        flat = traverse_util.flatten_dict(params)
        return traverse_util.unflatten_dict({p: p[-1] != "bias" and p[-2:] != ("LayerNorm", "scale") for p in flat})

    optimizer = optax.inject_hyperparams(optax.adamw, static_args=("mask",))(
        learning_rate=0.0, b1=recipe["b1"], b2=recipe["b2"], eps=recipe["eps"],
        weight_decay=recipe["weight_decay"], mask=decay_mask_fn)
    state = train_state.TrainState.create(apply_fn=model.__call__, params=model.params, tx=optimizer)

    @jax.jit
    def train_step(state, batch, learning_rate, dropout_rng):
        def loss_fn(params):
            labels = batch["labels"]
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            logits = state.apply_fn(**inputs, params=params, dropout_rng=dropout_rng, train=True)[0]
            label_mask = jnp.where(labels > 0, 1.0, 0.0)
            loss = optax.softmax_cross_entropy(logits, onehot(labels, logits.shape[-1])) * label_mask
            return loss.sum() / label_mask.sum()

        loss, grad = jax.value_and_grad(loss_fn)(state.params)
        state.opt_state.hyperparams["learning_rate"] = learning_rate
        return state.apply_gradients(grads=grad), loss

    budget, rng, step, log = StepBudget(deadline, recipe["warmup_steps"]), np.random.default_rng(0), 0, []
    dropout_rng = jax.random.PRNGKey(0)
    while True:
        for index in np.array_split(rng.permutation(len(rows)), len(rows) // recipe["batch_size"]):
            index = index[: recipe["batch_size"]]
            inputs, labels = flax_collator_masking(rows[index], special[index], recipe["mask_rate"], tokenizer)
            batch = {"input_ids": inputs, "labels": labels, "attention_mask": np.ones_like(inputs),
                     "token_type_ids": np.zeros_like(inputs)}
            step += 1
            dropout_rng, step_rng = jax.random.split(dropout_rng)
            state, loss = train_step(state, batch, budget.learning_rate(step - 1, recipe["learning_rate"]), step_rng)
            if step % 50 == 0:
                log.append({"step": step, "loss": float(loss), "t": time.time()})
            if not budget.after_step(step):
                return _save_flax(run_dir, model, state.params, step, log)


def flax_collator_masking(rows: np.ndarray, special: np.ndarray, rate: float, tokenizer):
    """run_mlm_flax.py's FlaxDataCollatorForLanguageModeling.mask_tokens on full rows (no padding): each non-special
    token chosen with probability `rate` from numpy's global generator; of those 80 % [MASK], half the rest a random
    id below the vocabulary size, the rest kept. Returns (input_ids, labels: the original id where chosen, else
    -100), int32 as the script's."""
    inputs, labels = rows.astype(np.int32), rows.astype(np.int32)
    chosen = np.random.binomial(1, np.where(special, 0.0, rate)).astype(bool)
    labels[~chosen] = -100
    as_mask = np.random.binomial(1, np.full(rows.shape, 0.8)).astype(bool) & chosen
    inputs[as_mask] = tokenizer.mask_token_id
    as_random = np.random.binomial(1, np.full(rows.shape, 0.5)).astype(bool) & chosen & ~as_mask
    random_ids = np.random.randint(tokenizer.vocab_size, size=rows.shape, dtype="i4")
    inputs[as_random] = random_ids[as_random]
    return inputs, labels


def _save_flax(run_dir: str, model, params, step: int, log: list) -> None:
    """The Flax folder, and a PyTorch one for the evaluator, converted by transformers' own Flax-to-PyTorch
    loader (`from_pretrained(from_flax=True)` leaves every tensor on the meta device under 4.57.6 with torch 2.13)."""
    import transformers
    from transformers.modeling_flax_pytorch_utils import load_flax_weights_in_pytorch_model

    trained_at = time.time()
    model.save_pretrained(os.path.join(run_dir, "flax"), params=params)
    torch_model = load_flax_weights_in_pytorch_model(transformers.BertForMaskedLM(model.config), params)
    torch_model.save_pretrained(os.path.join(run_dir, "hf"))
    _write_side_record(run_dir, step, trained_at, log)


def transformers_side(run_dir: str, recipe: dict, deadline: float) -> None:
    """run_mlm.py's recipe in a plain PyTorch loop: BertForMaskedLM on the group_texts rows."""
    import torch
    import transformers

    torch.manual_seed(0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(recipe["tokenizer"])
    with open(os.path.join(os.path.dirname(run_dir), "texts.json")) as f:
        rows = grouped_rows(json.load(f)["train"], tokenizer, recipe["max_seq_length"])
    model = transformers.BertForMaskedLM(transformers.BertConfig(**bert_config_kwargs(recipe),
                                                                 attn_implementation="sdpa"))
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if all(p is not q for q in no_decay)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": recipe["weight_decay"]},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=0.0, betas=(recipe["b1"], recipe["b2"]), eps=recipe["eps"])
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=recipe["mask_rate"], seed=0)
    budget, rng, step, log = StepBudget(deadline, recipe["warmup_steps"]), np.random.default_rng(0), 0, []
    model.train()
    while True:
        for index in np.array_split(rng.permutation(len(rows)), len(rows) // recipe["batch_size"]):
            batch = collator([{"input_ids": r.tolist()} for r in rows[index[: recipe["batch_size"]]]])
            for group in optimizer.param_groups:
                group["lr"] = budget.learning_rate(step, recipe["learning_rate"])
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["max_grad_norm"])
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step % 50 == 0:
                log.append({"step": step, "loss": loss.item(), "t": time.time()})
            if not budget.after_step(step):
                trained_at = time.time()
                model.save_pretrained(os.path.join(run_dir, "hf"))
                return _write_side_record(run_dir, step, trained_at, log)


def _write_side_record(run_dir: str, step: int, trained_at: float, log: list) -> None:
    with open(os.path.join(run_dir, "side.json"), "w") as f:
        json.dump({"steps": step, "trained_at": trained_at, "log": log}, f)


def bert_jax_side(out: str, run_dir: str, recipe: dict, deadline: float) -> dict:
    """README (a)'s command with the shared tokenizer; SIGTERM at the deadline; the newest checkpoint exported."""
    from bert_jax.train import export

    steps = max(1, round(recipe["num_steps"] * FLAGS.minutes / 8.0))
    command = [sys.executable, "-m", "bert_jax.pretrain", f"--config={FLAGS.config}", f"--workdir={run_dir}",
               f"--config.data.tokenizer.path={recipe['tokenizer']}", "--config.checkpoint.every_steps=100",
               f"--config.train.num_steps={steps}", "--config.logging.plots=False"]
    with open(os.path.join(out, os.path.basename(run_dir) + ".log"), "w") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)  # the run saves the step it is at and exits
            process.wait()
    trained_at = time.time()
    done = os.path.exists(os.path.join(run_dir, "DONE"))
    step = export.export(run_dir, os.path.join(run_dir, "hf"))
    _write_side_record(run_dir, step, trained_at, [])
    return {"done": bool(done)}


def run_side(out: str, side: str, round_index: int, recipe: dict) -> dict:
    """One side for --minutes; returns its record: steps, seconds, load averages."""
    run_dir = os.path.join(out, f"r{round_index}_{side}")
    os.makedirs(run_dir, exist_ok=True)
    start = time.time()
    deadline = start + 60 * FLAGS.minutes
    load_before = os.getloadavg()
    record = {}
    if side == "bert_jax":
        record = bert_jax_side(out, run_dir, recipe, deadline)
    else:
        python = FLAGS.hf_flax_python if side == "hf_flax" else sys.executable
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
                   JAX_PLATFORMS="cpu")
        with open(os.path.join(out, f"r{round_index}_{side}.log"), "w") as log:
            subprocess.run([python, os.path.abspath(__file__), f"--config={FLAGS.config}",
                            f"--hf_config={FLAGS.hf_config}", f"--out={out}", f"--side={side}",
                            f"--run_dir={run_dir}", f"--deadline={deadline}"], cwd=ROOT, env=env, stdout=log,
                           stderr=subprocess.STDOUT, check=True)
    with open(os.path.join(run_dir, "side.json")) as f:
        trained = json.load(f)
    return {**record, "side": side, "round": round_index, "steps": trained["steps"],
            "seconds": trained["trained_at"] - start, "load_before": load_before[0], "load_after": os.getloadavg()[0],
            "folder": os.path.join(run_dir, "hf")}


# ------------------------------------------------------------------------------------------------------------
# One evaluator.
# ------------------------------------------------------------------------------------------------------------
def make_eval_set(out: str, recipe: dict) -> dict:
    """The held-out documents as group_texts rows, each masked --eval_maskings times by the collator; fixed."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(recipe["tokenizer"])
    with open(os.path.join(out, "texts.json")) as f:
        rows = grouped_rows(json.load(f)["eval"], tokenizer, recipe["max_seq_length"])
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


def table(results: list[dict]) -> str:
    lines = ["| round | side | steps | seconds | eval MLM loss | eval MLM accuracy | load average (1 min) before, "
             "after |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['round']} | {r['side']} | {r['steps']} | {r['seconds']:.0f} | {r['loss']:.3f} | "
                     f"{r['accuracy']:.4f} | {r['load_before']:.1f}, {r['load_after']:.1f} |")
    return "\n".join(lines)


def main(argv) -> None:
    del argv
    if FLAGS.side:
        with open(os.path.join(os.path.dirname(FLAGS.run_dir), "recipe.json")) as f:
            recipe = json.load(f)
        side = hf_flax_side if FLAGS.side == "hf_flax" else transformers_side
        return side(FLAGS.run_dir, recipe, FLAGS.deadline)
    os.makedirs(FLAGS.out, exist_ok=True)
    recipe = prepare(FLAGS.out)
    results_path = os.path.join(FLAGS.out, "results.json")
    if FLAGS.score_only:
        with open(results_path) as f:
            runs = json.load(f)["runs"]
    else:
        runs = []
        for round_index in range(FLAGS.rounds):
            order = FLAGS.sides[round_index % len(FLAGS.sides):] + FLAGS.sides[: round_index % len(FLAGS.sides)]
            for side in order:
                runs.append(run_side(FLAGS.out, side, round_index, recipe))
                print(json.dumps(runs[-1]), flush=True)
    eval_set = make_eval_set(FLAGS.out, recipe)
    for run in runs:
        run.update(evaluate(run["folder"], eval_set))
    with open(results_path, "w") as f:
        json.dump({"minutes": FLAGS.minutes, "recipe": recipe, "runs": runs}, f, indent=1)
    print(f"{FLAGS.minutes:g} minutes per side; {len(eval_set['labels'])} held-out rows x maskings, "
          f"{runs[0]['tokens'] if runs else 0} masked tokens scored\n")
    print(table(runs))


if __name__ == "__main__":
    app.run(main)
