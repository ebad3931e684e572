"""Helpers shared by the RoBERTa and ALBERT Hugging Face parity tests."""
import flax.linen as nn
import jax
import numpy as np


def random_params(model, batch: dict, seed: int = 0, scale: float = 0.2) -> dict:
    """Params of `model`'s shapes, drawn without running init (eval_shape: no compilation on 2 CPU cores).

    Every tensor is random, LayerNorm scales around 1, so no tensor sits at a symmetric
    init constant (scale 1, bias 0) behind which a mixed-up tensor could hide. At scale 0.2
    activations are large enough that using GELU's tanh approximation on one side and the
    exact GELU on the other moves the logits by 3e-4 to 6e-4 of their largest, 15-30x
    numerics.TRANSFORMERS (at 0.05 only 1e-5 to 6e-5: too close to the bound to be caught).
    """
    shapes = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), batch)["params"]))
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        value = scale * rng.standard_normal(leaf.shape).astype(np.float32)
        return value + 1.0 if path[-1].key == "scale" else value

    return jax.tree_util.tree_map_with_path(draw, shapes)


def gathered(logits: np.ndarray, positions) -> np.ndarray:
    """logits [batch, length, vocab] at positions [batch, predictions] -> [batch, predictions, vocab]."""
    return np.take_along_axis(logits, np.asarray(positions)[..., None], axis=1)
