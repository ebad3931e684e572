"""The first run: what 2 CPU cores learn best in about six and a half minutes on the embedded corpus (issue 67).

    bert-jax pretrain --config=configs/first_run.py --workdir=runs/first_run

Cramming's recipe (configs/crammed.py:tiny: pre-LN, rotary positions, gated GELU, no biases, no dropout, MLM alone
on packed rows, a one-cycle learning rate; the modernbert family) at 2 layers x 128, a 2048-piece WordPiece trained
first, batch 32 throughout, 1300 steps, peak learning rate 5e-3. FIGURES_PENDING

configs/tiny.py (a post-LN BERT with NSP, the tests' and guides' model) stays what it was; three sweeps chose this
instead (configs/sweeps/first_run_screen.py, first_run_heads_lr.py, first_run_crammed.py; the table is in
docs/results/first-run.md). The step count, not a clock, ends the run, so the same command gives the same losses.
A smaller vocabulary predicts smaller pieces, an easier task per token: the eval line's most-frequent-token floor
is printed beside the accuracy, and accuracies at different vocabularies do not compare.
"""
from bert_jax.configs import crammed


def get_config(arg: str | None = None):
    if arg:
        raise ValueError(f"--config=configs/first_run.py:{arg}: this config has no variants")
    c = crammed.get_config("tiny")
    c.model.hidden_size = 128
    c.model.intermediate_size = 192  # each half of the gated GELU: 1.5 x hidden, as the tiny variant's 96 for 64
    c.train.batch_size_warmup.start_batch_size = 0  # batch 32 from the first step, as the sweep ran it (no ramp)
    c.train.global_batch_size = 32
    c.train.learning_rate = 5e-3
    c.train.num_steps = 1300
    c.train.eval_every_steps = 325
    c.checkpoint.every_steps = 325
    return c
