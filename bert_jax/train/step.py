"""The jitted train and eval steps: pure functions of (state, batch, frozen)."""
import jax
import jax.numpy as jnp
import optax

from bert_jax import UserError
from bert_jax.objectives.objective import Objective
from bert_jax.train.state import EmaTrainState, TrainState

# The rng streams a model may draw from: `dropout`, and `sample` for what a model samples in its
# forward pass (replaced-token detection's generator). The sample key is folded off the dropout key,
# so families that never sample see the dropout key they always did.
SAMPLE_FOLD = 1
# Eval keys are fold_in(fold_in(run key, EVAL_FOLD), eval batch index): a constant no step reaches,
# so eval never draws a train step's numbers, and every eval of the same params draws the same.
EVAL_FOLD = 2**32 - 1


# config.train.dropout_prng: the PRNG implementations dropout may draw from.
DROPOUT_PRNGS = ("threefry", "rbg", "unsafe_rbg")


def model_rngs(key: jax.Array, dropout_prng: str = "threefry") -> dict:
    """The rngs of one training micro-step from its (threefry) key.

    With `dropout_prng` rbg or unsafe_rbg the dropout key is re-seeded from four words of the threefry key,
    so it still follows from the seed and the step (resume stays exact), but the masks are drawn by XLA's
    RngBitGenerator: cheaper bits on GPUs, the same keep rate, not the same masks (and, unlike threefry, not
    the same masks on another sharding). The sample key stays threefry's.
    """
    if dropout_prng not in DROPOUT_PRNGS:
        raise UserError(f"config.train.dropout_prng={dropout_prng!r} is not a PRNG; known: {', '.join(DROPOUT_PRNGS)}")
    dropout = key
    if dropout_prng != "threefry":
        dropout = jax.random.wrap_key_data(jax.random.bits(key, (4,), jnp.uint32), impl=dropout_prng)
    return {"dropout": dropout, "sample": jax.random.fold_in(key, SAMPLE_FOLD)}


def eval_sample_key(seed: int, index) -> jax.Array:
    """The sample key of eval batch `index` of a run seeded `seed`; the same at every eval."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), EVAL_FOLD), index)


def split_microbatches(batch: dict, num_micro: int) -> dict:
    """[global, ...] -> [num_micro, global / num_micro, ...], micro-batch a = examples a, a+n, a+2n, ...

    Striding (rather than contiguous chunks) keeps each device's shard of the batch
    axis holding its part of every micro-batch, so the split moves no data.
    """
    def split(x):
        return jnp.swapaxes(x.reshape((x.shape[0] // num_micro, num_micro) + x.shape[1:]), 0, 1)

    return jax.tree.map(split, batch)


def with_frozen_outputs(outputs: dict, frozen_model, frozen, batch: dict) -> dict:
    """`outputs` plus, under "frozen", those of `frozen_model` (e.g. a distillation teacher) on the same batch.

    The frozen network runs deterministically on its own variables `frozen`, which are no
    part of the train state: no gradient (the step differentiates the params alone), no
    optimizer state, no checkpoint. Without a frozen model, `outputs` is returned untouched.
    """
    if frozen_model is None:
        return outputs
    frozen_outputs = frozen_model.apply({"params": frozen}, batch, deterministic=True)
    return {**outputs, "frozen": jax.lax.stop_gradient(frozen_outputs)}


def masked_fraction(batch: dict) -> jax.Array:
    """Realised share of the batch's non-special tokens that are predicted: sum(masked_weights) / sum(maskable_tokens)."""
    maskable = jnp.sum(batch["maskable_tokens"].astype(jnp.float32))
    return jnp.sum(batch["masked_weights"].astype(jnp.float32)) / jnp.maximum(maskable, 1.0)


def make_train_step(model, objective: Objective, tx: optax.GradientTransformation, grad_accum_steps: int,
                    frozen_model=None, dropout_prng: str = "threefry", grads_fn=None, ema_decay: float = 0.0):
    """Returns train_step(state, batch, frozen) -> (state, metrics); `frozen`: `frozen_model`'s params, or None.
    `dropout_prng`: config.train.dropout_prng (see `model_rngs`). `grads_fn`: (params, batch, step key, weights)
    -> (grads, sums) in place of the accumulation below, for a loss that couples the examples of a batch
    (contrastive in-batch negatives: bert_jax/finetune/contrastive.py's GradCache). `ema_decay`:
    config.train.ema_decay; a state with an `ema` moves it towards the new params (as levanter's
    EmaModelAveraging), in the params' dtype, on the params' shards.

    Gradient accumulation scans over micro-batches inside the step. optax.MultiSteps
    averages per-micro-step means, which weights micro-batches with few masked
    tokens too heavily; here every micro-step's loss is divided by the denominators
    of the whole global batch, so the update equals the one-shot update exactly.
    """

    model_rngs(jax.random.key(0), dropout_prng)  # an unknown PRNG fails here, before tracing

    def loss_fn(params, micro, key, weights, frozen):
        outputs = model.apply({"params": params}, micro, deterministic=False, rngs=model_rngs(key, dropout_prng))
        outputs = with_frozen_outputs(outputs, frozen_model, frozen, micro)
        sums = objective.sums(outputs, micro)
        return objective.loss(sums, weights), sums

    grad_fn = jax.grad(loss_fn, has_aux=True)

    finish = make_step_tail(objective, tx, ema_decay)

    def train_step(state: TrainState, batch: dict, frozen=None):
        weights = objective.weights(batch)
        step_key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        if grads_fn is not None:
            grads, sums = grads_fn(state.params, batch, step_key, weights)
        elif grad_accum_steps == 1:
            # No scan and no zero-filled gradient buffer: the gradients are the step's own.
            grads, sums = grad_fn(state.params, batch, jax.random.fold_in(step_key, 0), weights, frozen)
        else:
            micro = split_microbatches(batch, grad_accum_steps)

            def accumulate(carry, inputs):
                grads, sums = carry
                index, mb = inputs
                g, s = grad_fn(state.params, mb, jax.random.fold_in(step_key, index), weights, frozen)
                return (jax.tree.map(jnp.add, grads, g), jax.tree.map(jnp.add, sums, s)), None

            zeros_grads = jax.tree.map(jnp.zeros_like, state.params)
            zeros_sums = jax.tree.map(jnp.zeros_like, weights)
            (grads, sums), _ = jax.lax.scan(
                accumulate, (zeros_grads, zeros_sums), (jnp.arange(grad_accum_steps), micro)
            )
        return finish(state, grads, sums, weights, batch)

    return train_step


def make_eval_step(model, objective: Objective, seed: int = 0, frozen_model=None):
    """Returns eval_step(params, batch, index, frozen) -> (sums, weights); callers total them over the eval set.

    `index` is the batch's place in the eval set: what the model samples (no dropout in eval)
    is drawn from eval_sample_key(seed, index), so an eval repeats exactly, resumed or not.
    `frozen`: `frozen_model`'s params (a distillation teacher), or None.
    """

    def eval_step(params, batch: dict, index, frozen=None):
        rngs = {"sample": eval_sample_key(seed, index)}
        outputs = with_frozen_outputs(model.apply({"params": params}, batch, deterministic=True, rngs=rngs),
                                      frozen_model, frozen, batch)
        return objective.sums(outputs, batch), objective.weights(batch)

    return eval_step


def make_step_tail(objective: Objective, tx: optax.GradientTransformation, ema_decay: float = 0.0):
    """Returns finish(state, grads, sums, weights, batch) -> (state, metrics): the step after its gradients (the update,
    the skip of a non-finite step, the EMA and the metrics), which runs once per step however many micro-batches
    were accumulated. Its own function so that the planner can compile it alone and count it once
    (bert_jax/plan/compiled_plan.py), where the compiler's count of an accumulating step takes the micro-batch
    loop's body once."""

    def finish(state: TrainState, grads, sums, weights, batch: dict):
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = objective.metrics(sums, weights)
        metrics["grad_norm"] = optax.tree.norm(grads)
        if "maskable_tokens" in batch:  # the mask rate trained at: predicted / non-special tokens (masking.py)
            metrics["masked_fraction"] = masked_fraction(batch)
        # A non-finite loss or gradient leaves params and optimizer state as they
        # were, so NaNs can never reach a checkpoint; the loop sees the flag and
        # stops (or counts the skip) by config.train.nan_policy.
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        metrics["nonfinite"] = 1.0 - finite.astype(jnp.float32)
        new_params = keep(params, state.params)
        new_state = state.replace(
            step=state.step + 1,
            params=new_params,
            opt_state=keep(opt_state, state.opt_state),
        )
        if isinstance(state, EmaTrainState):
            # ema = d * ema + (1 - d) * params; a skipped step left the params as they were, so the EMA
            # takes no step either (it would otherwise still drift towards them).
            ema = optax.incremental_update(new_params, state.ema, step_size=1.0 - ema_decay)
            new_state = new_state.replace(ema=keep(ema, state.ema))
        return new_state, metrics

    return finish
