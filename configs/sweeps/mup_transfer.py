"""Learning-rate transfer across widths, μP against standard: a 2x learning-rate grid at three widths, both ways.

    bert-jax sweep run --sweep=configs/sweeps/mup_transfer.py --sweep_dir=runs/mup_transfer --parallel=3
    bert-jax sweep summary --sweep_dir=runs/mup_transfer

configs/tiny.py's 2-layer BERT at hidden sizes 32, 64 and 128 (FFN 4x, 2 heads, so the head size grows with the
width; vocabulary 2048), 7 learning rates 2x apart, standard and μP (base width 32, where the two are the same
model): 42 runs of 150 steps at sequence length 64, batch 8, each ending in an eval on the held-out split
(`eval/loss`, the MLM loss; summary.md lists it per run). Under μP the best rate should stay put as the width
grows; under standard it moves. Sized for a 2-core CPU shared with other jobs (about 50 minutes there, 3 points
at a time); on a real machine raise WIDTHS (e.g. 128, 256, 512, base 128), the batch and the steps.
docs/results/mup.md holds what it measured.
"""

WIDTHS = (32, 64, 128)
LEARNING_RATES = tuple(5e-4 * 2 ** k for k in range(7))  # 5e-4 .. 3.2e-2
STEPS = 150


def get_sweep():
    return dict(
        config="configs/tiny.py",
        overrides={"model.vocab_size": 2048, "data.max_seq_length": 64,
                   "train.global_batch_size": 8, "train.num_steps": STEPS, "train.warmup_steps": 15,
                   "train.log_every_steps": 50, "train.eval_every_steps": STEPS, "checkpoint.every_steps": STEPS,
                   "data.num_eval_batches": 8},
        # The base width is μP's alone: the standard arm leaves it at 0 (set, it would be refused as unread).
        points=[{"model.parametrization": parametrization, "model.hidden_size": width,
                 "model.mup_base_width": WIDTHS[0] if parametrization == "mup" else 0,
                 "model.intermediate_size": 4 * width, "train.learning_rate": rate}
                for width in WIDTHS for rate in LEARNING_RATES for parametrization in ("standard", "mup")],
        summary_keys=("eval/loss", "eval/mlm_accuracy", "train/loss"),
    )
