"""Shared fixtures: a model small enough to compile in seconds on 2 CPU cores."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

# One CPU device in this process, whatever XLA_FLAGS the shell exported: a forced device count would turn the
# configs' mesh (-1, 1, 1) into data parallelism. Multi-device tests start processes with their own count.
jax.config.update("jax_num_cpu_devices", 1)


def small_model_config(**overrides) -> ml_collections.ConfigDict:
    cfg = dict(
        family="bert", vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
        max_position_embeddings=64, type_vocab_size=2, dropout_rate=0.1, attention_dropout_rate=0.1,
        layer_norm_eps=1e-12, initializer_range=0.02, scan_layers=True, remat_policy="none",
        dtype="float32", param_dtype="float32",
    )
    cfg.update(overrides)
    return ml_collections.ConfigDict(cfg)


def random_batch(seed: int, batch: int = 4, length: int = 16, predictions: int = 5, vocab: int = 97) -> dict:
    """A pipeline-shaped batch with real padding: row i has length - 2*(i % 4) real tokens."""
    rng = np.random.default_rng(seed)
    lengths = np.array([length - 2 * (i % 4) for i in range(batch)])
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)
    positions = np.stack([rng.choice(n, predictions, replace=False) for n in lengths]).astype(np.int32)
    return {
        "input_ids": jnp.asarray(rng.integers(5, vocab, (batch, length)) * mask, jnp.int32),
        "token_type_ids": jnp.asarray((np.arange(length)[None, :] >= length // 2) * mask, jnp.int32),
        "attention_mask": jnp.asarray(mask),
        "masked_positions": jnp.asarray(positions),
        "masked_ids": jnp.asarray(rng.integers(5, vocab, (batch, predictions)), jnp.int32),
        "masked_weights": jnp.asarray(np.ones((batch, predictions)), jnp.float32),
        "next_sentence_label": jnp.asarray(rng.integers(0, 2, batch), jnp.int32),
    }


@pytest.fixture
def batch():
    return random_batch(0)
