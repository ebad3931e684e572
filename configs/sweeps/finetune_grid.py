"""A fine-tuning grid: learning rate x epochs x seed over configs/finetune/classification.py (12 runs).

    bert-jax sweep run --sweep=configs/sweeps/finetune_grid.py --sweep_dir=runs/ft_grid \
        --config... (set data and init_from in `overrides` below, or edit them here)
    bert-jax sweep summary --sweep_dir=runs/ft_grid

summary.md lists every run's final validation loss and accuracy, then their mean ± std over
the seeds of each (learning rate, epochs) point.
"""


def get_sweep():
    return dict(
        config="configs/finetune/classification.py",
        command="bert_jax.finetune",
        overrides={"init_from": "runs/tiny", "data.train": "data/train.csv"},
        grid={"train.learning_rate": [2e-5, 5e-5], "train.epochs": [2.0, 3.0], "seed": [0, 1, 2]},
        summary_keys=("train/loss", "eval/loss", "eval/accuracy", "eval/macro_f1"),
    )
