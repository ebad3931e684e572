"""The BERT recipe at the first run's full budget (issue 67): configs/tiny.py at a 2048-piece vocabulary, 1100 steps
(1.28e10 FLOPs a step, about the old tiny.py's 1000 steps of time), over seeds.

    bert-jax sweep run --sweep=configs/sweeps/first_run_bert.py --sweep_dir=runs/first_run_bert --parallel=2
    bert-jax sweep summary --sweep_dir=runs/first_run_bert

Each evaluates on the held-out split's first 96 rows (all it holds in batches of 32). About 6 minutes of idle
CPU a seed. Seed 0 ended at 0.1611 eval MLM accuracy (2026-12-04; docs/results/first-run.md): the first screen's
vocabulary gain at a third of the budget did not last, and configs/first_run.py took Cramming's recipe instead.
"""


def get_sweep():
    return dict(
        config="configs/tiny.py",
        overrides={"model.vocab_size": 2048, "train.num_steps": 1100, "data.num_eval_batches": 1000,
                   "train.eval_every_steps": 275, "logging.plots": False},
        grid={"seed": [0, 1]},
    )
