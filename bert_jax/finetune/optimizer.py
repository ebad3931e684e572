"""The fine-tuning recipe of the field (Devlin et al. 2019, §4; Sun et al. 2019 for layer-wise decay):
AdamW, linear warmup over a fraction of the steps then linear decay to 0, gradient clipping, and
per-depth update scales: layer-wise learning-rate decay and freezing.

Depth is read off parameter names the transformer stack shares across families: `embeddings`
(and the embedding projection) are depth 0, `layers_i` (or row i of a scanned `layers`) depth
i + 1, everything else (pooler, task head) depth num_layers + 1. A parameter's update is scaled
by decay ** (num_layers + 1 - depth), and by 0 when frozen.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.train.optimizer import decay_mask

_LAYER = re.compile(r"^layers_(\d+)$")


def learning_rate_schedule(train_cfg, num_steps: int) -> optax.Schedule:
    warmup = int(round(train_cfg.warmup_fraction * num_steps))
    return optax.join_schedules(
        [optax.linear_schedule(0.0, train_cfg.learning_rate, max(warmup, 1)),
         optax.linear_schedule(train_cfg.learning_rate, 0.0, max(num_steps - warmup, 1))], [warmup])


def _depth_scales(names: list[str], shape, train_cfg, num_layers: int):
    """The update scale of one parameter: a float, or [num_layers, 1, ...] for a scanned stack."""
    top = num_layers + 1

    def scale(depth):
        frozen = (depth == 0 and train_cfg.freeze_embeddings) or (1 <= depth <= train_cfg.freeze_layers) or (
            depth == 0 and train_cfg.freeze_layers > 0)
        return 0.0 if frozen else train_cfg.layer_lr_decay ** (top - depth)

    if any(n.startswith("embedding") for n in names):
        return scale(0)
    for n in names:
        match = _LAYER.match(n)
        if match:
            return scale(int(match.group(1)) + 1)
    if "layers" in names and len(shape) >= 1 and shape[0] == num_layers:
        per_layer = np.array([scale(i + 1) for i in range(num_layers)], np.float32)
        return per_layer.reshape((num_layers,) + (1,) * (len(shape) - 1))
    return scale(top)


def scale_by_depth(train_cfg, num_layers: int) -> optax.GradientTransformation:
    def update(updates, state, params=None):
        def scaled(path, u):
            names = [str(getattr(k, "key", k)) for k in path]
            return u * jnp.asarray(_depth_scales(names, u.shape, train_cfg, num_layers), u.dtype)

        return jax.tree_util.tree_map_with_path(scaled, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(train_cfg, num_steps: int, num_layers: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    schedule = learning_rate_schedule(train_cfg, num_steps)
    parts = [optax.clip_by_global_norm(train_cfg.max_grad_norm)] if train_cfg.max_grad_norm > 0 else []
    parts.append(optax.adamw(schedule, b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
                             weight_decay=train_cfg.weight_decay, mask=decay_mask))
    if train_cfg.layer_lr_decay != 1.0 or train_cfg.freeze_embeddings or train_cfg.freeze_layers:
        parts.append(scale_by_depth(train_cfg, num_layers))
    return optax.chain(*parts), schedule
