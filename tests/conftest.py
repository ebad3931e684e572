"""Shared fixtures: a model small enough to compile in seconds on 2 CPU cores."""
import os

# Without LLVM's optimisations the CPU programs compile in about half the time, and the suite is mostly compiles
# (tests/test_train_step.py and test_pretrain.py: 188 s -> 100 s). Every program of a test, and of the processes it
# starts (they inherit this), is compiled alike, so what a test compares stands. Set before JAX makes its client.
os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""),
                                                 "--xla_backend_optimization_level=0"]))

import jax  # noqa: E402
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

from bert_jax.run import backend_choice

# As a command does where it starts: on a host with libtpu but no TPU, JAX on the CPU, here and in the processes the
# tests start, without a screen of libtpu errors (`import bert_jax` leaves that choice to its user).
backend_choice.cpu_without_a_tpu()

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


def with_changes(tree, **changes):
    """`tree` (a dict or ConfigDict) with each `a__b=value` set at tree["a"]["b"], in place; returns it."""
    for key, value in changes.items():
        *parents, leaf = key.split("__")
        node = tree
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return tree


@pytest.fixture
def batch():
    return random_batch(0)


@pytest.fixture(scope="session")
def xla_cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("xla_cache"))


@pytest.fixture(scope="module")
def xla_compile_cache(xla_cache_dir):
    """XLA's persistent compilation cache, for one module, in a folder the whole session shares.

    Modules that run the same config (test_pretrain's micro runs, test_checkpoint_faults',
    test_reproducibility's) load the first run's compiled programs instead of compiling again.
    Only compiled programs are shared (XLA's CPU compiler is deterministic): every run still
    builds its data, initialises and steps. Other modules compile as before.
    """
    options = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
               "jax_persistent_cache_min_entry_size_bytes")
    saved = {name: getattr(jax.config, name) for name in options}
    jax.config.update("jax_compilation_cache_dir", xla_cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # Re-reads the options above, even after earlier compiles.
    yield
    for name, value in saved.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


from cloud_emulators import gcs, gcs_via_proxy, s3  # noqa: E402,F401  (emulated gs:// and s3:// buckets)
