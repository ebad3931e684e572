"""Replaced-token detection: the corruption and its labels, the objective's loss and metrics, and where
gradients may flow (the sample is a stop-gradient; GDES keeps the discriminator off the shared table)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from hf_parity import random_params
from numerics import REORDERED, assert_close

from bert_jax.families import get_family
from bert_jax.models.layers import Embed
from bert_jax.models.replaced_token_detection import GradientDisentangledEmbed, corrupt_masked_tokens
from bert_jax.objectives.replaced_token_detection import replaced_token_detection


def test_a_correctly_sampled_token_counts_as_original_and_padding_predictions_write_nothing():
    mask_id = 9
    input_ids = jnp.array([[1, mask_id, 4, mask_id, 2, 0]])  # original: 1 5 4 6 2 (pad)
    positions = jnp.array([[1, 3, 0]])
    masked_ids = jnp.array([[5, 6, 0]])
    weights = jnp.array([[1.0, 1.0, 0.0]])  # the third prediction is padding (position 0)
    sampled = jnp.array([[5, 7, 8]])  # right at position 1, wrong at 3; the padding draw (8) must not land
    corrupted, labels = jax.jit(corrupt_masked_tokens)(input_ids, positions, masked_ids, weights, sampled)
    np.testing.assert_array_equal(corrupted, [[1, 5, 4, 7, 2, 0]])
    np.testing.assert_array_equal(labels, [[0, 0, 0, 1, 0, 0]])


def _outputs_and_batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    outputs = {"mlm_logits": jnp.asarray(rng.normal(size=(4, 3, 11)), jnp.float32),
               "rtd_logits": jnp.asarray(rng.normal(size=(4, 6)), jnp.float32),
               "rtd_labels": jnp.asarray(rng.integers(0, 2, (4, 6)), jnp.float32)}
    batch = {"masked_ids": jnp.asarray(rng.integers(0, 11, (4, 3))),
             "masked_weights": jnp.asarray([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 0, 0]], jnp.float32),
             "attention_mask": jnp.asarray([[1] * 6, [1] * 4 + [0] * 2, [1] * 5 + [0], [1] * 3 + [0] * 3])}
    return outputs, batch


def test_rtd_loss_is_generator_mlm_plus_lambda_times_bce_over_real_tokens():
    outputs, batch = _outputs_and_batch()
    objective = replaced_token_detection(50.0)
    # Jitted: one compilation rather than dozens of op-by-op ones (slow on 2 busy cores).
    metrics_of = jax.jit(lambda o, b: objective.metrics(objective.sums(o, b), objective.weights(b)))
    metrics = metrics_of(outputs, batch)
    logits, labels = np.asarray(outputs["rtd_logits"], np.float64), np.asarray(outputs["rtd_labels"])
    real = np.asarray(batch["attention_mask"]) > 0
    bce = np.logaddexp(0, logits) - labels * logits  # -log sigmoid(+/- logit)
    predicted = logits > 0
    expected = {
        "discriminator_loss": bce[real].mean(),
        "discriminator_accuracy": (predicted == labels)[real].mean(),
        "replaced_rate": labels[real].mean(),
        "discriminator_replaced_accuracy": predicted[real & (labels == 1)].mean(),
        "discriminator_original_accuracy": (~predicted)[real & (labels == 0)].mean(),
    }
    assert_close({k: metrics[k] for k in expected}, {k: np.float32(v) for k, v in expected.items()}, REORDERED)
    assert_close(metrics["loss"], metrics["generator_mlm_loss"] + 50.0 * metrics["discriminator_loss"], REORDERED)
    # Padding tokens count for nothing: scrambling their logits changes no metric.
    noisy = {**outputs, "rtd_logits": jnp.where(real, outputs["rtd_logits"], 1e3)}
    again = metrics_of(noisy, batch)
    jax.tree.map(np.testing.assert_array_equal, again, metrics)
    assert objective.headline[0] == "discriminator_accuracy"


def test_rtd_metrics_do_not_depend_on_the_batch_split():
    outputs, batch = _outputs_and_batch(1)
    objective = replaced_token_detection()

    @jax.jit
    def whole_and_halves(outputs, batch):
        whole = objective.metrics(objective.sums(outputs, batch), objective.weights(batch))
        halves = [({k: v[s] for k, v in outputs.items()}, {k: v[s] for k, v in batch.items()})
                  for s in (slice(0, 2), slice(2, 4))]
        sums = [objective.sums(o, b) for o, b in halves]
        weights = [objective.weights(b) for _, b in halves]
        return whole, objective.metrics({k: sums[0][k] + sums[1][k] for k in sums[0]},
                                        {k: weights[0][k] + weights[1][k] for k in weights[0]})

    whole, total = whole_and_halves(outputs, batch)
    assert_close(total, whole, REORDERED)


def micro_electra_config():
    return ml_collections.ConfigDict(dict(
        family="electra", vocab_size=64, embedding_size=16, hidden_size=32, num_layers=1, num_heads=4,
        intermediate_size=64, max_position_embeddings=32, type_vocab_size=2, generator_size_ratio=0.5,
        dropout_rate=0.0, attention_dropout_rate=0.0, dtype="float32", attention_impl="xla", scan_layers=False))


def micro_batch(seed: int = 0, batch: int = 2, length: int = 12, predictions: int = 3) -> dict:
    rng = np.random.default_rng(seed)
    positions = np.stack([rng.choice(np.arange(1, length - 2), predictions, replace=False) for _ in range(batch)])
    weights = np.ones((batch, predictions), np.float32)
    weights[-1, -1] = 0
    positions[-1, -1] = 0
    mask = np.ones((batch, length), np.int32)
    mask[-1, -2:] = 0
    return {"input_ids": jnp.asarray(rng.integers(1, 64, (batch, length)), jnp.int32),
            "attention_mask": jnp.asarray(mask), "token_type_ids": jnp.zeros((batch, length), jnp.int32),
            "masked_positions": jnp.asarray(positions, jnp.int32),
            "masked_ids": jnp.asarray(rng.integers(1, 64, (batch, predictions)), jnp.int32),
            "masked_weights": jnp.asarray(weights)}


@pytest.fixture(scope="module")
def electra_step():
    """One compiled function of (params, sample key): the discriminator loss's gradient and the corrupted ids."""
    model_cfg = micro_electra_config()
    family = get_family("electra")
    model, objective = family.build_model(model_cfg), family.objective_for(model_cfg)
    batch = micro_batch(1, batch=4, predictions=5)

    def term(p, key, name):
        outputs = model.apply({"params": p}, batch, rngs={"sample": key})
        sums, weights = objective.sums(outputs, batch), objective.weights(batch)
        return sums[name] / weights[name], outputs["corrupted_ids"]

    def step(p, key):
        return jax.grad(term, has_aux=True)(p, key, "discriminator_loss")

    # random_params: init itself compiles for half a minute on 2 busy cores; eager dispatch is slower still.
    return model, batch, random_params(model, batch), jax.jit(step)


def test_the_discriminator_loss_gives_the_generator_no_gradient(electra_step):
    _, _, params, step = electra_step
    from_discriminator, _ = step(params, jax.random.key(3))
    for leaf in jax.tree.leaves(from_discriminator["generator"]):
        np.testing.assert_array_equal(leaf, 0)  # exactly: the sample is a stop-gradient
    assert np.abs(from_discriminator["embeddings"]["word"]["embedding"]).max() > 0  # the shared table learns
    assert np.abs(from_discriminator["discriminator"]["rtd_output"]["kernel"]).max() > 0


def test_sampling_follows_the_sample_key_and_nothing_else(electra_step):
    model, batch, params, step = electra_step
    corrupted = lambda seed: np.asarray(step(params, jax.random.key(seed))[1])  # noqa: E731
    np.testing.assert_array_equal(corrupted(5), corrupted(5))
    assert (corrupted(5) != corrupted(6)).any()
    with pytest.raises(ValueError, match="rngs=\\{'sample'"):
        jax.eval_shape(lambda: model.apply({"params": params}, batch))


class _GdesToy(nn.Module):
    """A generator table and a discriminator reading it through GDES: the shape of DeBERTa-v3's sharing."""

    @nn.compact
    def __call__(self, ids):
        shared = Embed(10, 4, name="shared")
        discriminator_table = GradientDisentangledEmbed(shared, name="discriminator_embeddings")
        return jnp.sum(shared(ids) ** 2), jnp.sum(jnp.sin(discriminator_table(ids)))


def test_gdes_keeps_the_discriminator_loss_off_the_shared_embedding():
    model, ids = _GdesToy(), jnp.array([[1, 2, 3, 2]])
    params = nn.meta.unbox(model.init(jax.random.key(0), ids))["params"]
    np.testing.assert_array_equal(params["discriminator_embeddings"]["delta"], 0)  # zero-initialised
    discriminator_grads, generator_grads = jax.jit(lambda p: (
        jax.grad(lambda q: model.apply({"params": q}, ids)[1])(p),
        jax.grad(lambda q: model.apply({"params": q}, ids)[0])(p)))(params)
    np.testing.assert_array_equal(discriminator_grads["shared"]["embedding"], 0)
    assert np.abs(np.asarray(discriminator_grads["discriminator_embeddings"]["delta"])[[1, 2, 3]]).min() > 0
    # The generator's own loss does reach the shared table.
    assert np.abs(np.asarray(generator_grads["shared"]["embedding"])[[1, 2, 3]]).min() > 0


@pytest.mark.parametrize("ratio, message", [
    (2.0, "generator must be no larger than the discriminator"),
    (1 / 3, "does not|divides it evenly"),
])
def test_a_generator_that_does_not_fit_fails_naming_the_key(ratio, message):
    model_cfg = micro_electra_config()
    model_cfg.generator_size_ratio = ratio
    with pytest.raises(ValueError, match=f"config.model.generator_size_ratio=.*({message})"):
        get_family("electra").build_model(model_cfg)
