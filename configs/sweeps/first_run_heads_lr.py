"""The first run's second screen (issue 67): at the 2048-piece vocabulary the first screen chose, heads, learning rate
and batch, at a third of the budget.

    bert-jax sweep run --sweep=configs/sweeps/first_run_heads_lr.py --sweep_dir=runs/first_run_heads_lr --parallel=4
    bert-jax sweep summary --sweep_dir=runs/first_run_heads_lr

As configs/sweeps/first_run_screen.py: every arm spends the FLOPs of 370 steps of batch 32 at vocabulary 2048
(1.28e10 FLOPs a step, 4.7e12 in all; the head count changes no matmul), evaluated on the held-out split's first 96
examples at 15 % masking. Results: docs/results/first-run.md.
"""

OLD_TINY = {  # configs/tiny.py before issue 67 (as in first_run_screen.py)
    "model.vocab_size": 8192, "model.hidden_size": 128, "model.num_layers": 2, "model.num_heads": 2,
    "model.intermediate_size": 512, "train.global_batch_size": 32, "train.learning_rate": 2e-3,
    "train.warmup_steps": 50, "data.max_seq_length": 128, "data.mask_rate": 0.15,
}


def get_sweep():
    return dict(
        config="configs/tiny.py",
        overrides={**OLD_TINY, "model.vocab_size": 2048, "data.num_eval_batches": 3, "train.eval_every_steps": 370,
                   "checkpoint.every_steps": 10_000, "logging.plots": False},
        points=[
            {"train.num_steps": 370},  # the control: the first screen's vocab_size=2048 arm
            {"train.num_steps": 370, "model.num_heads": 8},
            {"train.num_steps": 370, "train.learning_rate": 4e-3, "train.warmup_steps": 100, "train.b2": 0.98},
            {"train.num_steps": 740, "train.global_batch_size": 16, "model.num_heads": 8, "train.warmup_steps": 100,
             "data.num_eval_batches": 6},
        ],
    )
