"""Long context on the CPU: a tiny ModernBERT pre-trains on packed rows of 2048 tokens (slow: ~2 min)."""
import numpy as np
import pytest

import bert_jax.configs.modernbert_base
from bert_jax.train.loop import train_and_evaluate
from test_pretrain import train_losses


@pytest.mark.slow
def test_tiny_modernbert_trains_at_sequence_2048(tmp_path):
    c = bert_jax.configs.modernbert_base.get_config("tiny")
    c.model.vocab_size = 1024
    c.model.hidden_size = 32
    c.model.intermediate_size = 64
    c.model.num_layers = 3  # global, local, local
    c.model.max_position_embeddings = 2048
    c.model.local_attention = 128  # the paper's window: 64 tokens either side of 2048
    c.data.max_seq_length = 2048
    c.data.max_predictions_per_seq = 615  # 30 % of 2048, rounded up
    c.data.num_eval_batches = 1
    c.data.tokenizer.sample_bytes = 1_000_000
    c.train.global_batch_size = 2
    c.train.num_steps = 30
    c.train.warmup_steps = 3
    c.train.log_every_steps = 3
    c.train.eval_every_steps = c.checkpoint.every_steps = 30
    c.logging.plots = False
    c.logging.peak_flops_per_device = 1e11  # skip the matmul measurement
    train_and_evaluate(c, str(tmp_path))
    losses = [loss for _, loss in train_losses(str(tmp_path))]
    print(f"sequence 2048: train loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert np.isfinite(losses).all() and losses[-1] < losses[0] - 0.3
