"""A learning-rate sweep over configs/tiny.py: three runs of 300 steps.

    bert-jax sweep run --sweep=configs/sweeps/tiny_lr.py --sweep_dir=runs/tiny_lr
    bert-jax sweep summary --sweep_dir=runs/tiny_lr

About 2 minutes per run on 2 CPU cores; summary.md then lists each run's final
train and eval loss, and curves.png overlays their learning curves.
"""


def get_sweep():
    return dict(
        config="configs/tiny.py",
        overrides={"train.num_steps": 300, "train.eval_every_steps": 100, "checkpoint.every_steps": 300},
        grid={"train.learning_rate": [5e-4, 2e-3, 5e-3]},
    )
