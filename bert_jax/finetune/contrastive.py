"""Contrastive loss over the global batch, and GradCache for a batch larger than memory.

In-batch negatives (MultipleNegativesRankingLoss; Henderson et al. 2017): each pair's first text u_i must pick
its second text v_i among every second text and hard negative of the batch. The loss runs inside the jitted
step on the batch's global arrays, so "the batch" is the global batch: XLA gathers the candidates from every
data-parallel device and host, and the loss and gradient are those of one device holding all of it
(tests/test_contrastive.py pins it on 8 devices). The quality of such a model grows with the number of
negatives (nomic's contrastors, GTE: batches of 16k–64k), more than a device can hold: GradCache (Gao et al.
2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup") runs the encoder over chunks
without a gradient, takes the loss's gradient with respect to the embeddings of the whole batch, then runs each
chunk again and pulls that gradient back into the parameters. The result is the full batch's gradient; memory
holds one chunk's activations and the batch's embeddings.
"""
import jax
import jax.numpy as jnp
import optax

from bert_jax.train.step import model_rngs, split_microbatches

# What the sentence-embedding head returns for the ranking loss, per example: the embeddings of the two texts
# [batch, hidden], the hard negatives' [batch, negatives, hidden] (when the task has some) and the similarity
# scale [batch] (one value, repeated: learnable, it is a parameter of the head).
EMBEDDINGS = ("u", "v", "negatives", "scale")


def _unit(x):
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-9)


def ranking_loss_sums(outputs: dict, batch: dict, dims: tuple[int, ...] = ()) -> dict:
    """{"task_loss": the sum over the batch's pairs of the cross-entropy of u_i picking v_i among every v_j and every
    hard negative}; padding rows are nobody's candidate. With Matryoshka `dims` (Kusupati et al. 2022), the sum of
    that loss over the embeddings cut to their first d dimensions, the whole embedding's included."""
    u, w = outputs["u"], batch["label_weights"]
    candidates, valid = outputs["v"], w > 0
    if "negatives" in outputs:
        n = outputs["negatives"]
        candidates = jnp.concatenate([candidates, n.reshape(-1, n.shape[-1])])
        valid = jnp.concatenate([valid, jnp.repeat(valid, n.shape[1])])
    scale, total = outputs["scale"][0], 0.0
    for d in sorted(set(dims) | {u.shape[-1]}):
        logits = scale * jnp.einsum("bh,ch->bc", _unit(u[:, :d]), _unit(candidates[:, :d]),
                                    precision=jax.lax.Precision.HIGHEST)
        logits = jnp.where(valid[None, :], logits, -1e9)
        total = total + jnp.sum(optax.softmax_cross_entropy_with_integer_labels(logits, jnp.arange(len(u))) * w)
    return {"task_loss": total}


def merge_microbatches(tree):
    """The inverse of step.split_microbatches: [num_micro, global / num_micro, ...] -> [global, ...]."""
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[2:]), tree)


def grad_cache(model, objective, chunks: int, dropout_prng: str = "threefry"):
    """(params, batch, step key, weights) -> (grads, sums) of the whole batch, the encoder run `chunks` chunks at a
    time (make_train_step's grads_fn). Chunk i draws its dropout from fold_in(step key, i) in both passes, so the
    second pass recomputes exactly the embeddings the loss saw."""

    def embed(params, micro, key):
        out = model.apply({"params": params}, micro, deterministic=False, rngs=model_rngs(key, dropout_prng))
        return {k: out[k] for k in EMBEDDINGS if k in out}

    def grads_fn(params, batch, step_key, weights):
        micro = split_microbatches(batch, chunks)
        index = jnp.arange(chunks)
        # Pass 1: every chunk's embeddings, no activations kept.
        embeddings = jax.lax.map(lambda a: embed(params, a[1], jax.random.fold_in(step_key, a[0])), (index, micro))
        embeddings = jax.lax.stop_gradient(merge_microbatches(embeddings))

        def loss_of(e):
            sums = objective.sums(e, batch)
            return objective.loss(sums, weights), sums

        # The loss of the whole batch, and its gradient with respect to each example's embeddings.
        (_, sums), cached = jax.value_and_grad(loss_of, has_aux=True)(embeddings)
        cached = split_microbatches(cached, chunks)

        # Pass 2: each chunk again, its embeddings' cached gradient pulled back into the parameters.
        def accumulate(grads, a):
            i, mb, g = a
            _, pullback = jax.vjp(lambda p: embed(p, mb, jax.random.fold_in(step_key, i)), params)
            return jax.tree.map(jnp.add, grads, pullback(g)[0]), None

        grads, _ = jax.lax.scan(accumulate, jax.tree.map(jnp.zeros_like, params), (index, micro, cached))
        return grads, sums

    return grads_fn
