"""The embedded default: a 2-layer BERT pre-trained on Python's own documentation.

Runs on a laptop CPU with no download:

    bert-jax pretrain --config=configs/tiny.py --workdir=runs/tiny

Expect about 6 minutes on 2 CPU cores for 1000 steps (batch 32, seq 128, ~12k
tokens/s). The last eval line prints `eval/mlm_accuracy` (about 0.15) next to the
accuracy of always predicting the eval set's most frequent token (about 0.047), i.e.
over 3x that floor. Kill it and run the same command again: it resumes from the
newest checkpoint (every 200 steps) and finishes at step 1000.

`configs/tiny.py:two_stage` is the same model in two stages (seq 64, then 128), as one command:
see `two_stage` below.
"""
from bert_jax.configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    c.model.vocab_size = 8192
    c.model.hidden_size = 128
    c.model.num_layers = 2
    c.model.num_heads = 2
    c.model.intermediate_size = 512
    c.model.max_position_embeddings = 128
    c.model.dtype = "float32"  # bf16 matmuls are slow on CPU
    # Unrolled layers and no dropout: faster steps on 2 CPU cores, and a model this
    # small on ~7 epochs of a small corpus learns faster without it.
    c.model.scan_layers = False
    c.model.dropout_rate = 0.0
    c.model.attention_dropout_rate = 0.0

    c.data.max_seq_length = 128
    # What the eval split (base's eval_fraction of the corpus) holds at seq 128 in batches of 32: asking for more
    # would evaluate on these and warn at every run.
    c.data.num_eval_batches = 3

    c.train.global_batch_size = 32
    c.train.num_steps = 1000
    c.train.learning_rate = 2e-3
    c.train.warmup_steps = 50
    c.train.log_every_steps = 50
    c.train.eval_every_steps = 250

    c.checkpoint.every_steps = 200
    if arg == "two_stage":
        two_stage(c)
    elif arg:
        raise ValueError(f"--config=configs/tiny.py:{arg}: the only variant is 'two_stage'")
    return c


def two_stage(c) -> None:
    """BERT's two phases in miniature: 240 steps at seq 64, then 60 at seq 128, one schedule, one command.

        bert-jax pretrain --config=configs/tiny.py:two_stage --workdir=runs/tiny_two_stage

    The step recompiles for seq 128 at step 240; the learning rate goes on along the same linear decay
    to 0 at step 300; DONE is written once, at step 300. max_predictions_per_seq is auto in both
    stages: 10 at seq 64, 20 at seq 128.
    """
    c.data.max_seq_length = 64
    c.train.num_steps = 300
    c.train.stages = (dict(start=240, data=dict(max_seq_length=128)),)
    c.train.eval_every_steps = 120
    c.checkpoint.every_steps = 120
