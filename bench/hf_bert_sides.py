"""The Hugging Face BERT-recipe sides of bench/first_run_vs_hf.py: run_mlm_flax's and run_mlm's recipes.

They train a post-LN BERT (learned positions, dropout, the head at every position) of --hf_config's shape on
`group_texts` rows: a different recipe from bert_jax's first run, kept to show what a newcomer's Hugging Face script
reaches in the same minutes. The same-recipe race is torch_crammed's (bench/torch_crammed.py).

  hf_flax       transformers' examples/flax/language-modeling/run_mlm_flax.py, its training step as written there:
                FlaxBertForMaskedLM, its FlaxDataCollatorForLanguageModeling's masking (80/10/10), the cross-entropy
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

They do not know in advance how many steps fit: each times its steps 5 to 20, waiting for each step's result (JAX
dispatches asynchronously: a clock that does not wait times the dispatch), and then fixes its schedule's length to
fill 95 % of what is left of its minutes (the decay ends there); each also stops at the deadline whatever happens.
Once the length is fixed, each saves a folder every tenth of it and at its end, for the bench's evaluator.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np


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
    """A side's schedule length: after timing steps 5..20 it fixes the count that fills 95 % of what is left before
    the deadline (at least the steps already taken + 1). The caller waits for each step's result before
    `after_step`, so the clock times steps, not their dispatch."""

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

    def checkpoint_due(self, step: int, stopping: bool) -> bool:
        """Every tenth of the fixed total, and the last step."""
        return stopping or (self.total is not None and step % max(1, self.total // 10) == 0)


class Checkpoints:
    """The folders a side saves for the evaluator, each with the seconds since the side started, saving excluded."""

    def __init__(self, run_dir: str, started: float):
        self.run_dir, self.started, self.saving_s, self.saved = run_dir, started, 0.0, []

    def save(self, step: int, write) -> None:
        at = time.time() - self.started - self.saving_s
        before = time.time()
        write(os.path.join(self.run_dir, f"step_{step}"))
        self.saving_s += time.time() - before
        self.saved.append({"step": step, "seconds": at})

    def write_record(self, step: int, final_learning_rate: float, log: list, **more) -> None:
        """side.json: the steps taken, the folders saved, the learning rate of the last step, and `more`."""
        with open(os.path.join(self.run_dir, "side.json"), "w") as f:
            json.dump({"steps": step, "checkpoints": self.saved, "saving_s": self.saving_s, "log": log,
                       "final_learning_rate": final_learning_rate, **more}, f)


def hf_flax_side(run_dir: str, recipe: dict, started: float, deadline: float, seed: int) -> None:
    """run_mlm_flax.py's training step on group_texts rows; runs under transformers 4.57.6."""
    import jax
    import jax.numpy as jnp
    import optax
    import transformers
    from flax import traverse_util
    from flax.training import train_state
    from flax.training.common_utils import onehot
    from transformers.modeling_flax_pytorch_utils import load_flax_weights_in_pytorch_model

    tokenizer = transformers.AutoTokenizer.from_pretrained(recipe["tokenizer"])
    with open(os.path.join(os.path.dirname(run_dir), "texts.json")) as f:
        rows = grouped_rows(json.load(f)["train"], tokenizer, recipe["max_seq_length"])
    config = transformers.BertConfig(**bert_config_kwargs(recipe))
    model = transformers.FlaxBertForMaskedLM(config, seed=seed, dtype=jnp.float32)
    special = np.isin(rows, tokenizer.all_special_ids)
    np.random.seed(seed)  # the script's collator draws from numpy's global generator

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

    def write(folder: str) -> None:
        torch_model = load_flax_weights_in_pytorch_model(transformers.BertForMaskedLM(model.config), state.params)
        torch_model.save_pretrained(folder)

    budget, rng, step, log = StepBudget(deadline, recipe["warmup_steps"]), np.random.default_rng(seed), 0, []
    checkpoints, learning_rate = Checkpoints(run_dir, started), 0.0
    dropout_rng = jax.random.PRNGKey(seed)
    while True:
        for index in np.array_split(rng.permutation(len(rows)), len(rows) // recipe["batch_size"]):
            index = index[: recipe["batch_size"]]
            inputs, labels = flax_collator_masking(rows[index], special[index], recipe["mask_rate"], tokenizer)
            batch = {"input_ids": inputs, "labels": labels, "attention_mask": np.ones_like(inputs),
                     "token_type_ids": np.zeros_like(inputs)}
            step += 1
            dropout_rng, step_rng = jax.random.split(dropout_rng)
            learning_rate = budget.learning_rate(step - 1, recipe["learning_rate"])
            state, loss = train_step(state, batch, learning_rate, step_rng)
            jax.block_until_ready(loss)  # the clock below times the step, not its dispatch
            if step % 50 == 0:
                log.append({"step": step, "loss": float(loss), "t": time.time() - started})
            going_on = budget.after_step(step)
            if budget.checkpoint_due(step, not going_on):
                checkpoints.save(step, write)
            if not going_on:
                return checkpoints.write_record(step, learning_rate, log, schedule_total=budget.total)


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


def transformers_side(run_dir: str, recipe: dict, started: float, deadline: float, seed: int) -> None:
    """run_mlm.py's recipe in a plain PyTorch loop: BertForMaskedLM on the group_texts rows."""
    import torch
    import transformers

    torch.manual_seed(seed)
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
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=recipe["mask_rate"], seed=seed)
    budget, rng, step, log = StepBudget(deadline, recipe["warmup_steps"]), np.random.default_rng(seed), 0, []
    checkpoints, learning_rate = Checkpoints(run_dir, started), 0.0
    model.train()
    while True:
        for index in np.array_split(rng.permutation(len(rows)), len(rows) // recipe["batch_size"]):
            batch = collator([{"input_ids": r.tolist()} for r in rows[index[: recipe["batch_size"]]]])
            learning_rate = budget.learning_rate(step, recipe["learning_rate"])
            for group in optimizer.param_groups:
                group["lr"] = learning_rate
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["max_grad_norm"])
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step % 50 == 0:
                log.append({"step": step, "loss": loss.item(), "t": time.time() - started})
            going_on = budget.after_step(step)
            if budget.checkpoint_due(step, not going_on):
                checkpoints.save(step, model.save_pretrained)
            if not going_on:
                return checkpoints.write_record(step, learning_rate, log, schedule_total=budget.total)
