import jax.numpy as jnp
import numpy as np
from numerics import REORDERED, assert_close

from bert_jax.objectives.mlm import mlm_sums, mlm_weights
from bert_jax.objectives.nsp import nsp_sums, nsp_weights
from bert_jax.objectives.pretraining import BERT_PRETRAINING


def test_mlm_loss_equals_hand_computed_value():
    # One sequence, three prediction slots over a 3-token vocabulary; the third is padding.
    logits = jnp.array([[[2.0, 0.0, 0.0], [0.0, 1.0, 3.0], [9.0, -9.0, 0.0]]])
    ids = jnp.array([[0, 1, 2]])
    weights = jnp.array([[1.0, 1.0, 0.0]])
    sums, w = mlm_sums(logits, ids, weights), mlm_weights(weights)
    # -log softmax: slot 0 picks logit 2 of (2, 0, 0); slot 1 picks logit 1 of (0, 1, 3).
    xent0 = -(2.0 - np.log(np.exp(2.0) + 2.0))
    xent1 = -(1.0 - np.log(1.0 + np.exp(1.0) + np.exp(3.0)))
    # float32 log-softmax against float64: a few roundings (exp/log kernels differ by CPU), within REORDERED.
    assert_close(sums["mlm_loss"] / w["mlm_loss"], np.float32((xent0 + xent1) / 2), REORDERED)
    # Slot 0 argmax 0 == 0 (right), slot 1 argmax 2 != 1 (wrong); padding does not count.
    np.testing.assert_allclose(sums["mlm_accuracy"] / w["mlm_accuracy"], 0.5)


def test_nsp_ignores_padding_examples():
    logits = jnp.array([[3.0, 0.0], [0.0, 3.0], [5.0, -5.0]])
    labels = jnp.array([0, 0, -1])
    sums, w = nsp_sums(logits, labels), nsp_weights(labels)
    expected = (np.log1p(np.exp(-3.0)) + np.log1p(np.exp(3.0))) / 2
    assert_close(sums["nsp_loss"] / w["nsp_loss"], np.float32(expected), REORDERED)  # float32 vs float64
    np.testing.assert_allclose(sums["nsp_accuracy"] / w["nsp_accuracy"], 0.5)


def test_pretraining_loss_is_mlm_plus_nsp_and_independent_of_batch_split():
    rng = np.random.default_rng(0)
    outputs = {"mlm_logits": jnp.asarray(rng.normal(size=(4, 3, 11))), "nsp_logits": jnp.asarray(rng.normal(size=(4, 2)))}
    batch = {
        "masked_ids": jnp.asarray(rng.integers(0, 11, (4, 3))),
        "masked_weights": jnp.asarray([[1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], jnp.float32),
        "next_sentence_label": jnp.asarray([0, 1, 1, 0]),
    }
    obj = BERT_PRETRAINING
    whole = obj.metrics(obj.sums(outputs, batch), obj.weights(batch))
    np.testing.assert_array_equal(whole["loss"], whole["mlm_loss"] + whole["nsp_loss"])  # the same two ops
    # Splitting into halves and totalling sums and weights first gives the same numbers.
    halves = [({k: v[s] for k, v in outputs.items()}, {k: v[s] for k, v in batch.items()})
              for s in (slice(0, 2), slice(2, 4))]
    sums = [obj.sums(o, b) for o, b in halves]
    weights = [obj.weights(b) for _, b in halves]
    total = obj.metrics({k: sums[0][k] + sums[1][k] for k in sums[0]},
                        {k: weights[0][k] + weights[1][k] for k in weights[0]})
    assert_close(total, whole, REORDERED)  # the same sums, added in another order
