"""On the device present (a GPU in the lead's one call; the CPU in tests): the GPU defaults of issue 66 compute what
the reference path computes, compiled for that device. One JSON line, exit status 1 if any check fails.

    python bench/gpu_kernel_checks.py                        # BERT-base's widths (hidden 768, 12 heads), 2 layers
    python bench/gpu_kernel_checks.py --width=64 --heads=2   # a micro model (tests/test_gpu_variants.py, CPU)

Checks, each on the same inputs and dropout key:
  dropout_add_layer_norm  bert_jax/kernels/dropout_add_layer_norm.py against nn.Dropout + add + the lean norm
                          through autodiff, bf16 [batch, seq, width]: outputs, the three gradients, and the mask
                          (h's gradient is zero exactly where the mask drops; the re-drawn mask is the forward's)
  train_step              a BERT's loss and gradients with this platform's defaults (on a GPU: the stack unrolled,
                          the fused norm and projections) against the reference (scanned loop, unfused modules),
                          hidden dropout on, same key: equal to bf16 rounding
"""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

_WIDTH = flags.DEFINE_integer("width", 768, "Hidden size.")
_HEADS = flags.DEFINE_integer("heads", 12, "Attention heads.")
_SEQ = flags.DEFINE_integer("seq", 128, "Sequence length.")
_BATCH = flags.DEFINE_integer("batch", 32, "Batch size.")
_LAYERS = flags.DEFINE_integer("layers", 2, "Layers of the train-step check.")


def relative_error(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30))


def check_dropout_add_layer_norm(batch: int, seq: int, width: int) -> dict:
    from bert_jax.kernels import lean_backward
    from bert_jax.kernels.dropout_add_layer_norm import dropout_add_layer_norm, keep_mask

    rate, key = 0.1, jax.random.key(5)
    rng = np.random.default_rng(0)
    x, h = (jnp.asarray(rng.normal(size=(batch, seq, width)), jnp.bfloat16) for _ in range(2))
    scale, bias = jnp.asarray(rng.normal(size=width), jnp.float32), jnp.asarray(rng.normal(size=width), jnp.float32)
    w = jnp.asarray(rng.normal(size=(batch, seq, width)), jnp.float32)

    def reference(x, h, key, scale, bias, rate, epsilon, dtype):
        dropped = jax.lax.select(jax.random.bernoulli(key, 1.0 - rate, h.shape), h / (1.0 - rate), jnp.zeros_like(h))
        return lean_backward.layer_norm(x + dropped, scale, bias, epsilon, dtype)

    def run(f):
        def loss(x, h, s, b):
            y = f(x, h, key, s, b, rate, 1e-12, jnp.bfloat16)
            return jnp.sum(y.astype(jnp.float32) * w), y
        (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True))(x, h, scale, bias)
        return y, grads

    (y_fused, g_fused), (y_ref, g_ref) = run(dropout_add_layer_norm), run(reference)
    dropped = np.asarray(g_fused[1] == 0)
    return {"outputs_equal": bool(jnp.array_equal(y_fused, y_ref)),
            "gradient_errors": [relative_error(a, b) for a, b in zip(g_fused, g_ref)],
            "mask_equal": bool(np.array_equal(dropped, ~np.asarray(keep_mask(key, rate, h.shape)))),
            "dropped_fraction": float(dropped.mean())}


def check_train_step(batch: int, seq: int, width: int, heads: int, layers: int) -> dict:
    import ml_collections

    from bert_jax.configs import base
    from bert_jax.families import get_family
    from bert_jax.models.attention import devices_platform

    model_cfg = base.get_config().model
    model_cfg.update(vocab_size=1024, hidden_size=width, num_heads=heads, intermediate_size=4 * width,
                     num_layers=layers, max_position_embeddings=max(512, seq), dtype="bfloat16",
                     attention_dropout_rate=0.0)
    reference_cfg = ml_collections.ConfigDict(model_cfg.to_dict())
    reference_cfg.update(unroll_on_gpu=False, fused_dropout_norm=False, fused_qkv=False, attention_impl="xla")
    family = get_family("bert")
    rng = np.random.default_rng(1)
    tokens = rng.integers(5, 1024, (batch, seq))
    batch_arrays = {"input_ids": jnp.asarray(tokens, jnp.int32), "token_type_ids": jnp.zeros((batch, seq), jnp.int32),
                    "attention_mask": jnp.ones((batch, seq), jnp.int32),
                    "masked_positions": jnp.asarray(rng.integers(0, seq, (batch, 8)), jnp.int32),
                    "masked_ids": jnp.asarray(rng.integers(5, 1024, (batch, 8)), jnp.int32),
                    "masked_weights": jnp.ones((batch, 8), jnp.float32),
                    "next_sentence_label": jnp.zeros((batch,), jnp.int32)}
    models = [family.build_model(cfg) for cfg in (model_cfg, reference_cfg)]
    params = models[1].init({"params": jax.random.key(0)}, batch_arrays, deterministic=True)["params"]

    def value_and_grad(model):
        def loss(params):
            out = model.apply({"params": params}, batch_arrays, deterministic=False,
                              rngs={"dropout": jax.random.key(2)})
            return jnp.mean(jnp.square(out["mlm_logits"].astype(jnp.float32)))
        return jax.jit(jax.value_and_grad(loss))(params)

    (loss, grads), (ref_loss, ref_grads) = map(value_and_grad, models)
    largest = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(ref_grads))
    worst = max(float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32))))
                for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads))) / largest
    defaults = models[0].config
    return {"platform": devices_platform(jax.devices()), "scan_unroll": defaults.scan_unroll,
            "fused_dropout_norm": defaults.fused_dropout_norm, "fused_qkv": defaults.fused_qkv,
            "attention_impl": defaults.attention_impl,
            "loss_relative_error": abs(float(loss) - float(ref_loss)) / abs(float(ref_loss)),
            "gradient_error_over_largest": worst}


def main(argv):
    del argv
    norm = check_dropout_add_layer_norm(_BATCH.value, _SEQ.value, _WIDTH.value)
    step = check_train_step(_BATCH.value, _SEQ.value, _WIDTH.value, _HEADS.value, _LAYERS.value)
    # The fused norm runs the reference's ops: outputs and masks equal exactly, gradients to a few bf16 roundings
    # (XLA may fuse the two programs differently). The train step's attention kernel differs from the reference's
    # (cuDNN against xla on a GPU): bf16 rounding, 1e-2 of the largest gradient (tests/test_lean_backward.py's bar).
    ok = (norm["outputs_equal"] and norm["mask_equal"] and max(norm["gradient_errors"]) < 2e-2
          and step["loss_relative_error"] < 1e-2 and step["gradient_error_over_largest"] < 1e-2)
    print(json.dumps({"device": jax.devices()[0].device_kind, "dropout_add_layer_norm": norm, "train_step": step,
                      "ok": ok}), flush=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    app.run(main)
