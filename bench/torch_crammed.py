"""configs/first_run.py's recipe in transformers + torch: the torch_crammed sides of bench/first_run_vs_hf.py.

The same recipe as bert_jax's first run, in the framework a researcher would otherwise use, so that a race between
them compares codebases, not recipes (issue 75):
- the model is transformers' own `ModernBertForMaskedLM`, built from the config.json bert_jax's export writes for the
  recipe (2 layers x 64, GeGLU 96, no biases, no dropout, rotary positions), with `sparse_prediction=True` (the head
  runs on the masked positions only, as Cramming's and ours), SDPA attention, its own initialisation;
- its batches are bert_jax's: the same packed rows, positions restarting per document and masks (15 %, 80/10/10),
  drawn by bert_jax's pipeline for the same seed before the side starts (`dump_batches`) and read from one .npz,
  so the side pays nothing for its data. Documents in a row see only themselves, through the 4-D mask transformers
  5 takes per attention type (`document_mask`);
- torch.optim.AdamW with the recipe's betas, eps and weight decay off biases and norms (optimizer.decay_mask's
  rule), gradient clipping at the recipe's norm, and the recipe's one-cycle learning rate, step by step, as
  bert_jax's optax schedule gives it (`lrs` in the recipe);
- eager, or under `torch.compile` (default mode; its compile counts inside the side's minutes).

Every --eval_every steps it saves a Hugging Face folder (`step_N/`) and records the seconds since its process
started, less the seconds spent saving, so that the bench's one evaluator scores every side at the same steps.
"""
from __future__ import annotations

import time

import numpy as np

from hf_bert_sides import Checkpoints
from torch_bert import mlm_labels

# Names whose parameters take no weight decay: bert_jax's decay_mask (biases and LayerNorm scales) in HF's names.
NO_DECAY = ("bias", "norm.weight")


def document_mask(segment_ids):
    """[B, 1, S, S] bool: a token attends to the tokens of its own document (padding, segment 0, to padding)."""
    return (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])


def optimizer(model, recipe: dict):
    import torch

    named = list(model.named_parameters())
    no_decay = [p for n, p in named if n.endswith(NO_DECAY)]
    decay = [p for n, p in named if not n.endswith(NO_DECAY)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": recipe["weight_decay"]},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=recipe["lrs"][0], betas=(recipe["b1"], recipe["b2"]), eps=recipe["eps"])


def train(run_dir: str, recipe: dict, batches_path: str, started: float, deadline: float, seed: int,
          compiled: bool, init_scale: float = 1.0) -> None:
    """Trains the recipe's steps (or until `deadline`), saving a folder every recipe["eval_every"] steps.
    `init_scale`: every initialised matrix (not the norms) times this, e.g. 1 / 0.8796 for the standard deviation
    jax's truncated normal gives (it sets the std after the cut at +-2 std; torch's trunc_normal_ before it)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    fields = {k: v for k, v in recipe["hf_config"].items() if k not in ("model_type", "architectures")}
    config = transformers.AutoConfig.for_model("modernbert", **fields, sparse_prediction=True)
    model = transformers.ModernBertForMaskedLM(config).train()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.mul_(init_scale)
    opt = optimizer(model, recipe)
    step_fn = torch.compile(model) if compiled else model
    batches = dict(np.load(batches_path))
    steps, checkpoints, log, step = len(recipe["lrs"]), Checkpoints(run_dir, started), [], 0
    for step in range(1, steps + 1):
        i = step - 1
        for group in opt.param_groups:
            group["lr"] = recipe["lrs"][i]  # optax's count i: the rate step i + 1 trains at
        mask = document_mask(torch.as_tensor(batches["segment_ids"][i]))
        loss = step_fn(input_ids=torch.as_tensor(batches["input_ids"][i]).long(),
                       attention_mask={"full_attention": mask, "sliding_attention": mask},
                       position_ids=torch.as_tensor(batches["position_ids"][i]).long(),
                       labels=torch.as_tensor(mlm_labels({k: v[i] for k, v in batches.items()}))).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe["max_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % recipe["log_every"] == 0 or step == 1:
            log.append({"step": step, "loss": loss.item(), "t": time.time() - started - checkpoints.saving_s})
        stopping = step == steps or time.time() >= deadline
        if step % recipe["eval_every"] == 0 or stopping:
            checkpoints.save(step, model.save_pretrained)  # torch on a CPU has finished the step's work here
        if stopping:
            break
    checkpoints.write_record(step, recipe["lrs"][step - 1], log, compiled=compiled)
