"""The PyTorch side of bench/finetune_vs_torch.py: what a plain transformers + PyTorch script does.

    python -m bench.torch_finetune --model=/path/to/all-MiniLM-L6-v2 --data=/tmp/bigram_shift --seed=0

`AutoModelForSequenceClassification` from the folder (a fresh classifier on the pooled [CLS]),
the recipe of the field as Hugging Face's Trainer runs it: AdamW lr 2e-5, weight decay 0.01 on
everything but biases and LayerNorm weights, 10 % linear warmup then linear decay to 0, gradient
clipping at norm 1, batch 32, 3 epochs, sentences padded per batch and truncated to
`--max_seq_length`. Validation before the first step and then at least `--evals_per_run` times,
evenly spaced, as bert_jax does by default (bert_jax/finetune/cadence.py); test accuracy at the end. Two CPU threads
(`torch.set_num_threads(2)`), the machine the acceptance names. Prints one JSON line: the
accuracies, the wall-clock of the whole run (loading included) and the learning curves.
"""
import json
import math
import sys
import time

import numpy as np
import torch
import transformers
from absl import app, flags

from bench.make_finetune_data import read_csv

NO_DECAY = ("bias", "LayerNorm.weight")


def _batches(encoded: dict, labels: np.ndarray, batch_size: int, order: np.ndarray, pad_id: int):
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        ids = [encoded["input_ids"][i] for i in idx]
        length = max(len(x) for x in ids)
        input_ids = torch.full((len(idx), length), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), length), dtype=torch.long)
        for row, x in enumerate(ids):
            input_ids[row, :len(x)] = torch.tensor(x)
            mask[row, :len(x)] = 1
        yield input_ids, mask, torch.tensor(labels[idx], dtype=torch.long)


def evaluate(model, encoded, labels, batch_size, pad_id) -> tuple[float, float]:
    """(mean loss, accuracy) over a split."""
    model.eval()
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for ids, mask, y in _batches(encoded, labels, batch_size, np.arange(len(labels)), pad_id):
            out = model(input_ids=ids, attention_mask=mask, labels=y)
            loss_sum += float(out.loss) * len(y)
            correct += int((out.logits.argmax(-1) == y).sum())
    model.train()
    return loss_sum / len(labels), correct / len(labels)


def finetune(model_dir: str, data_dir: str, seed: int, epochs: float = 3.0, learning_rate: float = 2e-5,
             batch_size: int = 32, weight_decay: float = 0.01, warmup_fraction: float = 0.1,
             max_seq_length: int = 128, threads: int = 2, evals_per_run: int = 10) -> dict:
    start = time.perf_counter()
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    splits = {name: read_csv(f"{data_dir}/{name}.csv") for name in ("train", "validation", "test")}
    names = sorted(set(splits["train"][1]))
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    encoded, labels = {}, {}
    for name, (texts, label_names) in splits.items():
        encoded[name] = tokenizer(texts, truncation=True, max_length=max_seq_length)
        labels[name] = np.array([names.index(label) for label in label_names])
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=len(names), id2label=dict(enumerate(names)),
        label2id={n: i for i, n in enumerate(names)})
    model.train()
    groups = [
        {"params": [p for n, p in model.named_parameters() if not any(k in n for k in NO_DECAY)],
         "weight_decay": weight_decay},
        {"params": [p for n, p in model.named_parameters() if any(k in n for k in NO_DECAY)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=learning_rate)
    steps_per_epoch = math.ceil(len(labels["train"]) / batch_size)
    num_steps = int(round(epochs * steps_per_epoch))
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, int(round(warmup_fraction * num_steps)),
                                                             num_steps)
    eval_every = max(1, num_steps // evals_per_run)
    pad_id = tokenizer.pad_token_id
    curves = {"train_loss": [], "val_loss": [], "val_accuracy": []}
    val_loss, val_acc = evaluate(model, encoded["validation"], labels["validation"], batch_size, pad_id)
    curves["val_loss"].append((0, val_loss))
    curves["val_accuracy"].append((0, val_acc))
    train_start, step = time.perf_counter(), 0
    while step < num_steps:
        order = rng.permutation(len(labels["train"]))
        for ids, mask, y in _batches(encoded["train"], labels["train"], batch_size, order, pad_id):
            loss = model(input_ids=ids, attention_mask=mask, labels=y).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            curves["train_loss"].append((step, loss.item()))
            if step % eval_every == 0 or step == num_steps:
                val_loss, val_acc = evaluate(model, encoded["validation"], labels["validation"], batch_size, pad_id)
                curves["val_loss"].append((step, val_loss))
                curves["val_accuracy"].append((step, val_acc))
            if step == num_steps:
                break
    train_s = time.perf_counter() - train_start
    _, test_acc = evaluate(model, encoded["test"], labels["test"], batch_size, pad_id)
    return {"side": "torch", "seed": seed, "test_accuracy": test_acc, "validation_accuracy": val_acc,
            "steps": num_steps, "train_s": train_s, "wall_s": time.perf_counter() - start, "curves": curves}


def _main(argv) -> None:
    del argv
    f = flags.FLAGS
    result = finetune(f.model, f.data, f.seed, epochs=f.epochs, learning_rate=f.learning_rate,
                      max_seq_length=f.max_seq_length, threads=f.threads, evals_per_run=f.evals_per_run)
    print(json.dumps(result))


if __name__ == "__main__":
    flags.DEFINE_string("model", None, "A Hugging Face model folder.")
    flags.DEFINE_string("data", None, "A folder with train.csv, validation.csv, test.csv (sentence,label).")
    flags.DEFINE_integer("seed", 0, "Classifier init, dropout and batch order.")
    flags.DEFINE_float("epochs", 3.0, "Epochs.")
    flags.DEFINE_float("learning_rate", 2e-5, "Peak AdamW learning rate.")
    flags.DEFINE_integer("max_seq_length", 128, "Truncation length in tokens.")
    flags.DEFINE_integer("threads", 2, "torch.set_num_threads.")
    flags.DEFINE_integer("evals_per_run", 10, "Validation evaluations per run (and one before training).")
    flags.mark_flags_as_required(["model", "data"])
    sys.exit(app.run(_main))
