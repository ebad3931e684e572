"""The first run's recipe (issue 67) over seeds, judged on the whole held-out split.

    bert-jax sweep run --sweep=configs/sweeps/first_run.py --sweep_dir=runs/first_run --parallel=2
    bert-jax sweep summary --sweep_dir=runs/first_run

configs/tiny.py as README (a) runs it, twice (seeds 0 and 1), each evaluating on every held-out document
(num_eval_batches beyond what the split holds: the run warns and uses all of it) rather than the first three
batches. About 13 minutes of 2 idle cores. Results: docs/results/first-run.md.
"""


def get_sweep():
    return dict(
        config="configs/tiny.py",
        overrides={"model.vocab_size": 2048, "train.num_steps": 1100, "data.num_eval_batches": 1000,
                   "train.eval_every_steps": 275, "logging.plots": False},
        grid={"seed": [0, 1]},
    )
