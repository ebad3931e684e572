"""The first run's third screen (issue 67): Cramming's recipe (configs/crammed.py:tiny: pre-LN, rotary positions,
gated GELU, no biases, MLM alone on packed rows, a one-cycle schedule) at the first run's budget.

    bert-jax sweep run --sweep=configs/sweeps/first_run_crammed.py --sweep_dir=runs/first_run_crammed --parallel=3
    bert-jax sweep summary --sweep_dir=runs/first_run_crammed

configs/tiny.py (a post-LN BERT with NSP) ended at 0.161 eval MLM accuracy at the first run's budget at the
vocabulary (2048) that had led the first screen (configs/sweeps/first_run_bert.py). The crammed tiny variant reached 0.153 in 375
steps of 64 wide (about a minute of CPU). Here it gets the first run's budget: batch 32 throughout (no ramp), a
2048-piece vocabulary, 1300 steps at 128 wide (9.5e9 FLOPs a step, against 1.28e10 for tiny.py at this
vocabulary), or 1800 at 64 wide. Evaluated on the held-out split's first 96 rows at 15 % masking (packed rows:
not the NSP pairs of tiny.py). Results: docs/results/first-run.md.
"""


def get_sweep():
    return dict(
        config="configs/crammed.py:tiny",
        overrides={"train.batch_size_warmup.start_batch_size": 0, "train.global_batch_size": 32,
                   "logging.plots": False},
        points=[
            {"model.hidden_size": 128, "model.intermediate_size": 192, "train.learning_rate": 3e-3,
             "train.num_steps": 1300, "train.eval_every_steps": 325, "checkpoint.every_steps": 650},
            {"model.hidden_size": 128, "model.intermediate_size": 192, "train.learning_rate": 5e-3,
             "train.num_steps": 1300, "train.eval_every_steps": 325, "checkpoint.every_steps": 650},
            {"train.learning_rate": 5e-3, "train.num_steps": 1800, "train.eval_every_steps": 450,
             "checkpoint.every_steps": 900},
        ],
    )
