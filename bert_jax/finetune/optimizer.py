"""The fine-tuning recipe of the field (Devlin et al. 2019, §4; Sun et al. 2019 for layer-wise decay):
AdamW, linear warmup over a fraction of the steps then linear decay to 0, gradient clipping, and
per-depth update scales: layer-wise learning-rate decay and freezing.

A backbone parameter's depth is what its family declares (`Family.roles`, bert_jax.models.param_roles):
embeddings 0, layer i depth i + 1 (row i of a scanned stack), pooler and pre-training heads num_layers + 1;
one the family does not declare fails naming it. The task head (`head/`) is at the top. A parameter's
update is scaled by decay ** (num_layers + 1 - depth), and by 0 when frozen.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.families import Family
from bert_jax.train.optimizer import OPTIMIZERS, decay_mask

BACKBONE = "backbone"  # bert_jax.finetune.model: the family module's parameters; the rest is the task head


def learning_rate_schedule(train_cfg, num_steps: int) -> optax.Schedule:
    warmup = int(round(train_cfg.warmup_fraction * num_steps))
    return optax.join_schedules(
        [optax.linear_schedule(0.0, train_cfg.learning_rate, max(warmup, 1)),
         optax.linear_schedule(train_cfg.learning_rate, 0.0, max(num_steps - warmup, 1))], [warmup])


def depth_scales(family: Family, path: tuple[str, ...], shape, train_cfg, num_layers: int):
    """The update scale of one parameter of the task model: a float, or [rows, 1, ...] for a scanned stack."""
    top = num_layers + 1

    def scale(depth):
        frozen = (depth == 0 and train_cfg.freeze_embeddings) or (1 <= depth <= train_cfg.freeze_layers) or (
            depth == 0 and train_cfg.freeze_layers > 0)
        return 0.0 if frozen else train_cfg.layer_lr_decay ** (top - depth)

    if path[:1] != (BACKBONE,):
        return scale(top)
    depth = family.roles.depth(path[1:], shape, num_layers, family.name)
    if isinstance(depth, np.ndarray):
        return np.array([scale(d) for d in depth], np.float32).reshape((len(depth),) + (1,) * (len(shape) - 1))
    return scale(depth)


def scale_by_depth(train_cfg, num_layers: int, family: Family) -> optax.GradientTransformation:
    def update(updates, state, params=None):
        def scaled(path, u):
            names = tuple(str(getattr(k, "key", k)) for k in path)
            return u * jnp.asarray(depth_scales(family, names, u.shape, train_cfg, num_layers), u.dtype)

        return jax.tree_util.tree_map_with_path(scaled, updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(train_cfg, num_steps: int, num_layers: int, family: Family,
                   multipliers=None) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """family: whose roles give the backbone's depths. multipliers: μP's learning-rate multipliers of the task
    model (bert_jax/finetune/parametrization.py), applied as pre-training applies them (pre-training's adamw chain,
    the same numbers as optax.adamw's); None: optax.adamw."""
    schedule = learning_rate_schedule(train_cfg, num_steps)
    parts = [optax.clip_by_global_norm(train_cfg.max_grad_norm)] if train_cfg.max_grad_norm > 0 else []
    if multipliers is None:
        parts.append(optax.adamw(schedule, b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
                                 weight_decay=train_cfg.weight_decay, mask=decay_mask))
    else:
        parts.append(OPTIMIZERS.get("adamw")(schedule, b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
                                             weight_decay=train_cfg.weight_decay, mask=decay_mask,
                                             multipliers=multipliers))
    if train_cfg.layer_lr_decay != 1.0 or train_cfg.freeze_embeddings or train_cfg.freeze_layers:
        parts.append(scale_by_depth(train_cfg, num_layers, family))
    return optax.chain(*parts), schedule
