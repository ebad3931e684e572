"""config.model.remat_policy='auto': the pre-training step without remat where the compiler's count of it fits the
device's memory, else with full remat (bert_jax/train/remat_auto.py). Compiled for the host's one CPU device, whose
limit each test names."""
import pytest

import bert_jax.configs.base
from bert_jax.parallel.mesh import make_mesh
from bert_jax.run.device_memory import compiled_peak_bytes
from bert_jax.train import remat_auto
from bert_jax.train.program import build_program, lower_step


@pytest.fixture(scope="module")
def auto():
    """A micro BERT with remat_policy=auto, and the peak bytes of its step compiled without remat."""
    c = bert_jax.configs.base.get_config()
    c.model.update(vocab_size=128, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2,
                   max_position_embeddings=32, dropout_rate=0.0, remat_policy="auto")
    c.data.update(max_seq_length=32, max_predictions_per_seq=5)
    c.train.update(global_batch_size=4)
    mesh = make_mesh(c.mesh)
    plain = remat_auto.build(c, mesh, None)[0]
    peak, refused = remat_auto.peak_without_remat(c, mesh)  # compiled once: build below reads it again
    assert not refused and peak == compiled_peak_bytes(
        lower_step(build_program(plain, mesh), plain, mesh).compile().memory_analysis())
    return c, mesh, plain, peak


def test_no_known_limit_trains_without_remat(auto):
    config, _, plain, _ = auto
    assert plain.model.remat_policy == "none" and config.model.remat_policy == "auto"  # the caller's is untouched


def test_the_compilers_peak_against_the_limit_decides(auto):
    config, mesh, _, peak = auto
    assert remat_auto.build(config, mesh, peak)[0].model.remat_policy == "none"  # exactly at the limit: fits
    assert remat_auto.build(config, mesh, peak - 1)[0].model.remat_policy == "full"


def test_a_named_policy_is_kept(auto):
    config, mesh, _, _ = auto
    named = config.copy_and_resolve_references()
    named.model.remat_policy = "dots"
    assert remat_auto.build(named, mesh, 1)[0].model.remat_policy == "dots"  # no compile, whatever the limit
