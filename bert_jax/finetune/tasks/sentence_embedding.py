"""Sentence embeddings, SBERT-style (Reimers & Gurevych 2019): one encoder embeds both sentences of a pair.

`config.task.embedding_loss` picks the training signal: ranking (in-batch negatives on
pairs, MultipleNegativesRankingLoss), cosine (regression of cos(u, v) on scored pairs,
CosineSimilarityLoss) or softmax (a classifier over (u, v, |u - v|) on labelled pairs, NLI-style,
SoftmaxLoss). Evaluation is Spearman of cos(u, v) with `score_field` (STS). The export is a
sentence-transformers folder.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax.finetune import data, hf_heads, metrics
from bert_jax.finetune.model import pool
from bert_jax.finetune.tasks.task import Task
from bert_jax.models.layers import Dense
from bert_jax.objectives.objective import Objective

# SBERT's MultipleNegativesRankingLoss multiplies cosine similarities by 20 before the softmax.
RANKING_SCALE = 20.0


def cosine(u, v):
    return jnp.sum(u * v, -1) / jnp.maximum(jnp.linalg.norm(u, axis=-1) * jnp.linalg.norm(v, axis=-1), 1e-9)


def _ranking_sums(outputs: dict, batch: dict) -> dict:
    """In-batch negatives: logits [batch, batch], the positive of u_i is v_i, every other v_j a negative;
    padding rows are nobody's negative."""
    w = batch["label_weights"]
    logits = jnp.where(w[None, :] > 0, outputs["logits"], -1e9)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.arange(logits.shape[0]))
    return {"task_loss": jnp.sum(loss * w)}


def _cosine_sums(outputs: dict, batch: dict) -> dict:
    """The squared error of cos(u, v) [batch] to the pair's score."""
    return {"task_loss": jnp.sum((outputs["logits"] - batch["labels"]) ** 2 * batch["label_weights"])}


def _softmax_sums(outputs: dict, batch: dict) -> dict:
    loss = optax.softmax_cross_entropy_with_integer_labels(outputs["logits"], batch["labels"].astype(jnp.int32))
    return {"task_loss": jnp.sum(loss * batch["label_weights"])}


def _loss_only(sums) -> Objective:
    return Objective(sums=sums, weights=lambda b: {"task_loss": jnp.sum(b["label_weights"])},
                     loss_terms=("task_loss",), headline=())


OBJECTIVES = {"ranking": _loss_only(_ranking_sums), "cosine": _loss_only(_cosine_sums),
              "softmax": _loss_only(_softmax_sums)}


class SiameseHead(nn.Module):
    """Embeddings u, v of the two sentences, then per loss: ranking -> scaled cosine of every u with every v
    [batch, batch]; cosine -> cos(u, v) [batch]; softmax -> classifier over (u, v, |u - v|) [batch, num_labels]."""

    loss: str
    pooling: str
    num_outputs: int
    hidden_size: int
    initializer_range: float

    @nn.compact
    def __call__(self, encoded: list[dict], batch: dict, deterministic: bool) -> dict:
        first, second = encoded
        u = pool(first, batch["attention_mask"], self.pooling)
        v = pool(second, batch["pair_attention_mask"], self.pooling)
        if self.loss == "ranking":
            un = u / jnp.maximum(jnp.linalg.norm(u, axis=-1, keepdims=True), 1e-9)
            vn = v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-9)
            logits = RANKING_SCALE * un @ vn.T
        elif self.loss == "cosine":
            logits = cosine(u, v)
        else:
            features = jnp.concatenate([u, v, jnp.abs(u - v)], -1)
            logits = Dense((3 * self.hidden_size,), (self.num_outputs,), (None, None),
                           kernel_init=nn.initializers.normal(self.initializer_range), name="classifier")(features)
        return {"logits": logits.astype(jnp.float32), "u": u.astype(jnp.float32), "v": v.astype(jnp.float32)}


class SentenceEmbedding(Task):
    name = "sentence_embedding"

    def validate(self, task_cfg):
        if task_cfg.embedding_loss not in OBJECTIVES:
            raise ValueError(f"config.task.embedding_loss={task_cfg.embedding_loss!r}; expected one of "
                             f"{tuple(OBJECTIVES)}")

    def parse(self, task_cfg, record, split, skipped):
        """A training row's label is what its loss needs (none for ranking, the score for cosine, a class for
        softmax); validation and test rows need the `score_field` (Spearman)."""
        names = data.text_field_names(task_cfg)
        if len(names) != 2:
            raise ValueError(f"config.task.text_fields={task_cfg.text_fields!r}: sentence embeddings need two "
                             f"columns")
        texts = [data.field(record, name, skipped) for name in names]
        if any(t is None for t in texts) or data.any_empty(texts, skipped):
            return None
        row = {"texts": [str(t) for t in texts], "label": None, "score": None}
        loss = task_cfg.embedding_loss
        if split != "train" or loss == "cosine":
            raw = data.field(record, task_cfg.score_field, skipped)
            row["score"] = None if raw is None else data.number(raw, task_cfg.score_field, skipped)
            if row["score"] is None:
                return None
            row["label"] = row["score"]
        if split == "train" and loss == "softmax":
            row["label"] = data.field(record, task_cfg.label_field, skipped)
            if row["label"] is None:
                return None
            row["label"] = str(row["label"])
        return row

    def has_labels(self, task_cfg):
        return task_cfg.embedding_loss == "softmax"

    def labelled_splits(self, splits):
        return {"train": splits["train"]}  # softmax classes: evaluation reads scores, not classes

    def texts(self, task_cfg):
        return ("", "pair_")

    def featurize(self, task_cfg, data_cfg, fast, rows, names):
        index = {n: i for i, n in enumerate(names)}
        out = {}
        for i, prefix in enumerate(("", "pair_")):
            out.update(data.encode(fast.encode_batch([row["texts"][i] for row in rows]), prefix))
        labels = [0 if row["label"] is None else index[row["label"]] if names else row["label"] for row in rows]
        out["labels"] = np.array(labels, np.int32 if names else np.float32)
        out["scores"] = np.array([np.nan if row["score"] is None else row["score"] for row in rows], np.float32)
        out["label_weights"] = np.ones(len(rows), np.float32)
        return out

    def build_head(self, family, model_cfg, task_cfg, num_outputs, has_family_pooler):
        return SiameseHead(loss=task_cfg.embedding_loss, pooling=task_cfg.pooling, num_outputs=num_outputs,
                           hidden_size=model_cfg.hidden_size,
                           initializer_range=float(model_cfg.get("initializer_range", 0.02)))

    def objective(self, task_cfg):
        return OBJECTIVES[task_cfg.embedding_loss]

    def evaluate(self, task_cfg, outputs, features, names, rows):
        """Spearman of cos(u, v) with the gold scores (SBERT's STS evaluation), and the in-batch-negatives
        ranking loss over the whole split as its loss (every other pair a negative)."""
        u, v = outputs["u"], outputs["v"]
        un = u / np.maximum(np.linalg.norm(u, axis=-1, keepdims=True), 1e-9)
        vn = v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-9)
        log_probs = np.asarray(jax.nn.log_softmax(RANKING_SCALE * un @ vn.T, -1))
        out = {"loss": float(-np.mean(np.diag(log_probs)))}
        out.update(metrics.regression_metrics((un * vn).sum(-1), features["scores"]))
        return out

    def headline_metric(self, task_cfg):
        return "spearman"

    def predictions(self, task_cfg, outputs, features, rows, names):
        u, v = outputs["u"], outputs["v"]
        return [{"index": i, "cosine": float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-9))}
                for i, (a, b) in enumerate(zip(u, v))]

    def check_export(self, task_cfg):
        pass

    def export(self, out, params, config, names, tokenizer_dir):
        hf_heads.write_sentence_transformers(out, params, config, tokenizer_dir)
        return "a sentence-transformers folder"
