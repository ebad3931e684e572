"""The sentence-embedding losses are sentence-transformers' own: on the same embeddings u, v, our head and objective
give the loss (and its gradients) of CosineSimilarityLoss, SoftmaxLoss and MultipleNegativesRankingLoss, computed
by those classes in torch; rows that pad a short batch change nothing."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import bert_jax.configs.finetune.sentence_embedding
from bert_jax.finetune.tasks import get_task

torch = pytest.importorskip("torch")
st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")

HIDDEN, REAL, PADDING, CLASSES = 8, 6, 2, 3


class GivenEmbeddings(torch.nn.Module):
    """The reference loss's encoder: hands back the embeddings its features carry, so both sides see the same u, v."""

    device = torch.device("cpu")

    def forward(self, features: dict) -> dict:
        return {"sentence_embedding": features["embedding"]}


def pairs(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """u, v [REAL, HIDDEN] float32 (v near u for some rows, so cosines span [-1, 1]); scores in [0, 1]; classes."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=(REAL, HIDDEN)).astype(np.float32)
    v = (rng.uniform(-1, 1, (REAL, 1)) * u + rng.normal(size=(REAL, HIDDEN))).astype(np.float32)
    return u, v, rng.uniform(0, 1, REAL).astype(np.float32), rng.integers(0, CLASSES, REAL).astype(np.int32)


def our_loss(loss: str, u, v, labels, weights):
    """(loss, its gradient in u and v) of the sentence-embedding head and objective the fine-tuning run trains."""
    config = bert_jax.configs.finetune.sentence_embedding.get_config()
    config.task.embedding_loss = loss
    task = get_task("sentence_embedding")
    head = task.build_head(None, ml_collections.ConfigDict({"hidden_size": HIDDEN, "initializer_range": 0.02}),
                           config.task, CLASSES, False)
    objective = task.objective(config.task)
    ones = jnp.ones((len(u), 1), jnp.int32)
    batch = {"attention_mask": ones, "pair_attention_mask": ones, "labels": jnp.asarray(labels),
             "label_weights": jnp.asarray(weights)}
    encoded = lambda u, v: [{"hidden": u[:, None, :]}, {"hidden": v[:, None, :]}]  # noqa: E731  one token each
    params = nn.meta.unbox(head.init(jax.random.key(0), encoded(jnp.asarray(u), jnp.asarray(v)), batch, True))

    def loss_of(u, v):
        outputs = head.apply(params, encoded(u, v), batch, True)
        return objective.loss(objective.sums(outputs, batch), objective.weights(batch))

    value, (du, dv) = jax.jit(jax.value_and_grad(loss_of, argnums=(0, 1)))(jnp.asarray(u), jnp.asarray(v))
    return float(value), np.asarray(du), np.asarray(dv), params.get("params", {})  # cosine and ranking: none


def their_loss(loss: str, u, v, labels, our_params):
    """The same through sentence-transformers' loss class (SoftmaxLoss's classifier given our head's weights)."""
    model = GivenEmbeddings()
    if loss == "cosine":
        reference = st_losses.CosineSimilarityLoss(model)
        target = torch.tensor(labels)
    elif loss == "softmax":
        reference = st_losses.SoftmaxLoss(model, HIDDEN, CLASSES)
        classifier = our_params["classifier"]
        with torch.no_grad():
            reference.classifier.weight.copy_(torch.tensor(np.asarray(classifier["kernel"]).T))
            reference.classifier.bias.copy_(torch.tensor(np.asarray(classifier["bias"])))
        target = torch.tensor(labels, dtype=torch.long)
    else:
        reference = st_losses.MultipleNegativesRankingLoss(model)  # scale 20, cosine similarity
        target = None
    tu, tv = torch.tensor(u, requires_grad=True), torch.tensor(v, requires_grad=True)
    value = reference([{"embedding": tu}, {"embedding": tv}], target)
    value.backward()
    return value.item(), tu.grad.numpy(), tv.grad.numpy()


@pytest.mark.parametrize("loss", ["cosine", "softmax", "ranking"])
def test_sentence_embedding_losses_equal_sentence_transformers_and_ignore_padding_rows(loss):
    u, v, scores, classes = pairs(seed=1)
    labels = scores if loss == "cosine" else classes if loss == "softmax" else np.zeros(REAL, np.int32)
    ours, du, dv, params = our_loss(loss, u, v, labels, np.ones(REAL, np.float32))
    theirs, their_du, their_dv = their_loss(loss, u, v, labels, params)
    print(f"{loss}: ours {ours:.6f}, sentence-transformers {theirs:.6f}")
    assert ours == pytest.approx(theirs, rel=1e-5)
    np.testing.assert_allclose(du, their_du, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dv, their_dv, rtol=1e-4, atol=1e-6)

    # A short last batch is padded with rows of weight 0 (bert_jax.finetune.data.pad_batch): whatever they hold,
    # the loss and the real rows' gradients stay the same.
    rng = np.random.default_rng(2)
    pad = lambda x, fill: np.concatenate([x, fill.astype(x.dtype)])  # noqa: E731
    junk = rng.normal(size=(PADDING, HIDDEN))
    padded = our_loss(loss, pad(u, junk), pad(v, -junk), pad(labels, np.ones(PADDING)),
                      pad(np.ones(REAL, np.float32), np.zeros(PADDING)))
    assert padded[0] == pytest.approx(ours, rel=1e-6)
    np.testing.assert_allclose(padded[1][:REAL], du, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(padded[2][:REAL], dv, rtol=1e-5, atol=1e-7)
