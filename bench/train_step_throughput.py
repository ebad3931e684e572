"""Train-step throughput and MFU for the tiny, mini and base shapes at seq 128, on this machine.

    python bench/train_step_throughput.py [--shapes=tiny,mini,base] [--steps=5]

MFU is measured against a peak this benchmark measures itself: the best FLOP/s of a
large fp32 matmul on the same device. FLOPs per step (bert_jax/train/perf.py):

    6 * N * B * S + 12 * L * H * S^2 * B + 6 * H * V * B * P

N = non-embedding parameters, B = batch, S = 128, L = layers, H = hidden,
V = vocabulary, P = predicted positions per sequence (20).

It runs the same compiled step as `pretrain` (bert_jax.train.program), on a batch of
the pipeline's shapes, with the config's compute dtype (float32 here: bf16 matmuls
are emulated and slow on CPUs).
"""
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import bert_jax.configs.base
from bert_jax.parallel.mesh import global_batch, make_mesh
from bert_jax.train import counters, perf
from bert_jax.train.program import build_program

SHAPES = {
    # name: (layers, hidden, heads, mlp, vocab, batch)
    "tiny": (2, 128, 2, 512, 8192, 32),
    "mini": (4, 256, 4, 1024, 30522, 32),
    "base": (12, 768, 12, 3072, 30522, 8),
}

_SHAPES = flags.DEFINE_list("shapes", list(SHAPES), "Which shapes to run.")
_STEPS = flags.DEFINE_integer("steps", 5, "Timed steps per shape (after one compile step).")


def shape_config(name: str):
    layers, hidden, heads, mlp, vocab, batch = SHAPES[name]
    c = bert_jax.configs.base.get_config()
    c.model.update(num_layers=layers, hidden_size=hidden, num_heads=heads, intermediate_size=mlp,
                   vocab_size=vocab, dtype="float32")
    c.data.max_seq_length, c.data.max_predictions_per_seq = 128, 20
    c.train.global_batch_size = batch
    return c


def random_batch(c) -> dict:
    rng = np.random.default_rng(0)
    b, s, p = c.train.global_batch_size, c.data.max_seq_length, c.data.max_predictions_per_seq
    return {
        "input_ids": rng.integers(5, c.model.vocab_size, (b, s)).astype(np.int32),
        "token_type_ids": (np.arange(s)[None] >= s // 2).repeat(b, 0).astype(np.int32),
        "attention_mask": np.ones((b, s), np.int32),
        "masked_positions": np.stack([rng.choice(s, p, replace=False) for _ in range(b)]).astype(np.int32),
        "masked_ids": rng.integers(5, c.model.vocab_size, (b, p)).astype(np.int32),
        "masked_weights": np.ones((b, p), np.float32),
        "next_sentence_label": rng.integers(0, 2, b).astype(np.int32),
    }


def main(_):
    peak = perf.measure_matmul_peak(size=2048, dtype=jnp.float32, repeats=10)
    print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}; measured fp32 matmul peak "
          f"{peak / 1e9:.1f} GFLOP/s per device")
    print(f"{'shape':6} {'layers':>6} {'hidden':>6} {'batch':>5} {'params':>8} {'step_s':>8} "
          f"{'tokens/s':>9} {'GFLOP/s':>8} {'MFU':>6}")
    for name in _SHAPES.value:
        c = shape_config(name)
        program = build_program(c, make_mesh(c.mesh))
        with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules):
            state = program.init()
            batch = global_batch(random_batch(c), program.data_sharding)
            frozen = program.load_frozen()
            state, metrics = program.train_step(state, batch, frozen)
            jax.block_until_ready(metrics)
            t0 = time.perf_counter()
            for _ in range(_STEPS.value):
                state, metrics = program.train_step(state, batch, frozen)
            jax.block_until_ready(metrics)
            step_s = (time.perf_counter() - t0) / _STEPS.value
        flops = perf.step_flops(program, c)
        tokens = counters.tokens_per_step(c)
        params = perf.count_params(program.abstract_state.params)
        print(f"{name:6} {c.model.num_layers:6d} {c.model.hidden_size:6d} {c.train.global_batch_size:5d} "
              f"{params / 1e6:7.1f}M {step_s:8.3f} {tokens / step_s:9.0f} {flops / step_s / 1e9:8.1f} "
              f"{flops / step_s / (peak * jax.device_count()):6.1%}")


if __name__ == "__main__":
    app.run(main)
