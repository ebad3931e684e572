"""The task registry's pieces on their own: the file readers, the SBERT losses against their reference formulas,
and where the encoder's parameters come from (bert_jax/finetune/tasks/, run._pretrained)."""
import collections
import csv
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import configs.finetune.classification
import configs.finetune.sentence_embedding
import finetune_data as fd
from bert_jax.finetune import init_from
from bert_jax.finetune.run import _pretrained
from bert_jax.finetune.tasks import get_task, known_tasks
from bert_jax.finetune.tasks.sentence_embedding import OBJECTIVES, SiameseHead

torch = pytest.importorskip("torch")
st_util = pytest.importorskip("sentence_transformers.util")


def test_the_registry_holds_the_five_kinds_and_an_unknown_one_is_named():
    assert known_tasks() == ["classification", "regression", "sentence_embedding", "span_qa",
                             "token_classification"]
    with pytest.raises(ValueError, match=r"config.task.kind='ner' is unknown; known kinds: classification"):
        get_task("ner")


@pytest.mark.parametrize("fmt", ["tsv", "jsonl"])
def test_tsv_and_jsonl_give_the_rows_and_skip_counts_of_csv(fmt, tmp_path):
    c = configs.finetune.classification.get_config()
    rows = fd.sentiment_rows(12, 0)
    rows[3]["sentence"] = "   "  # an empty text
    fd.write_csv(tmp_path / "t.csv", rows)
    with open(tmp_path / "t.tsv", "w", newline="") as f:
        writer = csv.DictWriter(f, ("sentence", "label", "score"), delimiter="\t")
        writer.writeheader()
        writer.writerows(rows)
    with open(tmp_path / "t.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
        f.write(json.dumps({"sentence": "no label here"}) + "\n")
    task = get_task("classification")
    expected, expected_skipped = task.read(c.data, c.task, "train", str(tmp_path / "t.csv"))
    c.data.format = fmt
    got, skipped = task.read(c.data, c.task, "train", str(tmp_path / f"t.{fmt}"))
    assert got == expected and len(got) == 11
    assert skipped == expected_skipped + collections.Counter({"missing column 'label'": int(fmt == "jsonl")})


def _siamese_loss(loss: str, u: np.ndarray, v: np.ndarray, labels: np.ndarray) -> tuple[float, dict]:
    """Our objective's mean loss from the SBERT head on [CLS] states u, v; and the head's params."""
    head = SiameseHead(loss=loss, pooling="cls", num_outputs=3, hidden_size=u.shape[1], initializer_range=0.5)
    encoded = [{"hidden": jnp.asarray(u)[:, None]}, {"hidden": jnp.asarray(v)[:, None]}]
    batch = {"attention_mask": jnp.ones((len(u), 1)), "pair_attention_mask": jnp.ones((len(u), 1)),
             "labels": jnp.asarray(labels), "label_weights": jnp.ones(len(u))}
    params = head.init(jax.random.key(0), encoded, batch, True)
    outputs = head.apply(params, encoded, batch, True)
    objective = OBJECTIVES[loss]
    total = objective.sums(outputs, batch)["task_loss"] / objective.weights(batch)["task_loss"]
    return float(total), params


@pytest.mark.parametrize("loss", ["ranking", "cosine", "softmax"])
def test_sbert_losses_equal_sentence_transformers_formulas(loss):
    rng = np.random.default_rng(0)
    u, v = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((6, 8)).astype(np.float32)
    labels = rng.uniform(-1, 1, 6).astype(np.float32) if loss == "cosine" else rng.integers(0, 3, 6).astype(np.int32)
    ours, params = _siamese_loss(loss, u, v, labels)
    tu, tv = torch.tensor(u), torch.tensor(v)
    if loss == "ranking":  # MultipleNegativesRankingLoss: scale 20, in-batch negatives
        reference = torch.nn.functional.cross_entropy(20.0 * st_util.cos_sim(tu, tv), torch.arange(6))
    elif loss == "cosine":  # CosineSimilarityLoss: MSE of cos(u, v) to the score
        reference = torch.nn.functional.mse_loss(torch.cosine_similarity(tu, tv), torch.tensor(labels))
    else:  # SoftmaxLoss: a classifier over (u, v, |u - v|)
        dense = nn.meta.unbox(params)["params"]["classifier"]  # (Dense's kernel carries logical axes)
        features = torch.cat([tu, tv, (tu - tv).abs()], 1)
        logits = features @ torch.tensor(np.asarray(dense["kernel"])) + torch.tensor(np.asarray(dense["bias"]))
        reference = torch.nn.functional.cross_entropy(logits, torch.tensor(labels).long())
    np.testing.assert_allclose(ours, float(reference), rtol=1e-5)


def test_the_backbone_comes_from_the_source_and_reinit_pooler_keeps_the_fresh_pooler(tmp_path):
    hf_dir = fd.write_tiny_hf_bert(str(tmp_path / "hf"))
    c = configs.finetune.classification.get_config()
    source = init_from.resolve(hf_dir, c.model)
    fresh = {"backbone": jax.tree.map(lambda a: np.full(a.shape, 7.0, a.dtype), source.params),
             "head": {"classifier": {"kernel": np.ones((2, 2), np.float32)}}}
    kept = _pretrained(fresh, source, c)
    jax.tree.map(np.testing.assert_array_equal, kept["backbone"], source.params)
    jax.tree.map(np.testing.assert_array_equal, kept["head"], fresh["head"])  # the head stays fresh
    c.train.reinit_pooler = True
    fresh_pooler = _pretrained(fresh, source, c)
    jax.tree.map(np.testing.assert_array_equal, fresh_pooler["backbone"]["pooler"], fresh["backbone"]["pooler"])
    jax.tree.map(np.testing.assert_array_equal, fresh_pooler["backbone"]["encoder"], source.params["encoder"])
