"""The first run's screen (issue 67): one lever at a time against configs/tiny.py as it was, at equal compute.

    bert-jax sweep run --sweep=configs/sweeps/first_run_screen.py --sweep_dir=runs/first_run_screen --parallel=2
    bert-jax sweep summary --sweep_dir=runs/first_run_screen

Each arm trains for a third of the first run's budget, its step count sized from its FLOPs per step (the count
the run prints at start, bert_jax/train/perf.py) so that every arm spends about the FLOPs of 300 steps of the
old tiny.py (4.7e12): a cheaper step gets more steps. Every arm evaluates on the whole held-out split
(num_eval_batches beyond what the split holds: the run warns and uses all of it), so arms at one vocabulary
score the same text at the same 15 % masking; the vocabulary arms tokenise that same text into their own pieces,
which the table says. About 15 minutes of 2 idle cores for the seven arms. Results: docs/results/first-run.md.
"""

OLD_TINY = {  # configs/tiny.py before issue 67: the baseline every arm changes one thing of
    "model.vocab_size": 8192, "model.hidden_size": 128, "model.num_layers": 2, "model.num_heads": 2,
    "model.intermediate_size": 512, "train.global_batch_size": 32, "train.learning_rate": 2e-3,
    "train.warmup_steps": 50, "data.max_seq_length": 128, "data.mask_rate": 0.15,
}


def get_sweep():
    return dict(
        config="configs/tiny.py",
        overrides={**OLD_TINY, "data.num_eval_batches": 1000, "train.eval_every_steps": 100,
                   "checkpoint.every_steps": 10_000, "logging.plots": False},
        points=[
            {"train.num_steps": 300},  # the baseline: 1.58e10 FLOPs/step
            {"train.num_steps": 300, "train.learning_rate": 5e-3},
            {"train.num_steps": 600, "train.global_batch_size": 16},  # 7.9e9
            {"train.num_steps": 343, "model.vocab_size": 4096},  # 1.38e10
            {"train.num_steps": 370, "model.vocab_size": 2048},  # 1.28e10
            {"train.num_steps": 175, "model.num_layers": 4},  # 2.7e10
            {"train.num_steps": 240, "data.mask_rate": 0.3},  # 1.98e10 (40 predictions a row); its eval masks 30 %
        ],
    )
