"""Optimizer and learning-rate schedule, all from optax."""
import jax
import optax

OPTIMIZERS = ("adamw", "lamb")


def learning_rate_schedule(train_cfg) -> optax.Schedule:
    """Linear warmup from 0 to the peak, then linear decay to `end_learning_rate` at `num_steps` (BERT's)."""
    warmup = optax.linear_schedule(0.0, train_cfg.learning_rate, max(train_cfg.warmup_steps, 1))
    decay = optax.linear_schedule(
        train_cfg.learning_rate, train_cfg.end_learning_rate,
        max(train_cfg.num_steps - train_cfg.warmup_steps, 1),
    )
    return optax.join_schedules([warmup, decay], [train_cfg.warmup_steps])


def decay_mask(params):
    """True for parameters that take weight decay: not LayerNorm scales, not biases (as BERT)."""

    def takes_decay(path, _):
        names = [p.key for p in path if isinstance(p, jax.tree_util.DictKey)]
        return names[-1] not in ("bias", "scale") and not names[-1].endswith("_bias")

    return jax.tree_util.tree_map_with_path(takes_decay, params)


def make_optimizer(train_cfg) -> optax.GradientTransformation:
    if train_cfg.optimizer not in OPTIMIZERS:
        raise ValueError(f"config.train.optimizer={train_cfg.optimizer!r}; expected one of {OPTIMIZERS}")
    schedule = learning_rate_schedule(train_cfg)
    make = optax.adamw if train_cfg.optimizer == "adamw" else optax.lamb
    opt = make(
        schedule, b1=train_cfg.b1, b2=train_cfg.b2, eps=train_cfg.eps,
        weight_decay=train_cfg.weight_decay, mask=decay_mask,
    )
    if train_cfg.max_grad_norm > 0:
        return optax.chain(optax.clip_by_global_norm(train_cfg.max_grad_norm), opt)
    return opt
