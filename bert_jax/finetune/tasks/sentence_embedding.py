"""Sentence embeddings, SBERT-style (Reimers & Gurevych 2019): one encoder embeds both sentences of a pair.

`config.task.embedding_loss` picks the training signal: ranking (in-batch negatives on
pairs, MultipleNegativesRankingLoss, over the global batch, with optional hard negatives, a learnable
temperature, Matryoshka dimensions and GradCache: bert_jax/finetune/contrastive.py), cosine (regression of
cos(u, v) on scored pairs, CosineSimilarityLoss) or softmax (a classifier over (u, v, |u - v|) on labelled pairs, NLI-style,
SoftmaxLoss). Evaluation is Spearman of cos(u, v) with `score_field` (STS). The export is a
sentence-transformers folder.
"""
import functools
import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax import UserError
from bert_jax.finetune import contrastive, data, hf_heads, metrics
from bert_jax.finetune.model import pool
from bert_jax.finetune.tasks.task import Task
from bert_jax.models.layers import Dense
from bert_jax.objectives.objective import Objective
from bert_jax.train.step import make_train_step


def cosine(u, v):
    return jnp.sum(u * v, -1) / jnp.maximum(jnp.linalg.norm(u, axis=-1) * jnp.linalg.norm(v, axis=-1), 1e-9)


def _cosine_sums(outputs: dict, batch: dict) -> dict:
    """The squared error of cos(u, v) [batch] to the pair's score."""
    return {"task_loss": jnp.sum((outputs["logits"] - batch["labels"]) ** 2 * batch["label_weights"])}


def _softmax_sums(outputs: dict, batch: dict) -> dict:
    loss = optax.softmax_cross_entropy_with_integer_labels(outputs["logits"], batch["labels"].astype(jnp.int32))
    return {"task_loss": jnp.sum(loss * batch["label_weights"])}


def _loss_only(sums) -> Objective:
    return Objective(sums=sums, weights=lambda b: {"task_loss": jnp.sum(b["label_weights"])},
                     loss_terms=("task_loss",), headline=())


OBJECTIVES = {"ranking": _loss_only(contrastive.ranking_loss_sums), "cosine": _loss_only(_cosine_sums),
              "softmax": _loss_only(_softmax_sums)}


def matryoshka_dims(task_cfg) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in str(task_cfg.matryoshka_dims).split(",") if d.strip())
    except ValueError:
        raise UserError(f"config.task.matryoshka_dims={task_cfg.matryoshka_dims!r}: give dimensions as \"256,64\"")\
            from None


def negative_prefixes(task_cfg) -> tuple[str, ...]:
    """The feature prefixes of the hard negatives ("neg0_", ...): none without config.task.negative_field."""
    return tuple(f"neg{i}_" for i in range(task_cfg.num_negatives)) if task_cfg.negative_field else ()


class SiameseHead(nn.Module):
    """Embeddings u, v of the two sentences, then per loss: ranking -> u, v, the hard negatives' embeddings and the
    similarity scale (contrastive.EMBEDDINGS); cosine -> cos(u, v) [batch]; softmax -> classifier over
    (u, v, |u - v|) [batch, num_labels]."""

    loss: str
    pooling: str
    num_outputs: int
    hidden_size: int
    initializer_range: float
    temperature: float = 0.05
    learn_temperature: bool = False
    negatives: tuple[str, ...] = ()  # the hard negatives' feature prefixes

    @nn.compact
    def __call__(self, encoded: list[dict], batch: dict, deterministic: bool) -> dict:
        first, second = encoded[:2]
        u = pool(first, batch["attention_mask"], self.pooling)
        v = pool(second, batch["pair_attention_mask"], self.pooling)
        out = {"u": u.astype(jnp.float32), "v": v.astype(jnp.float32)}
        if self.loss == "ranking":
            log_scale = -math.log(self.temperature)
            if self.learn_temperature:  # CLIP's logit scale: learnt in log space, from 1 / temperature
                log_scale = self.param("log_scale", nn.initializers.constant(log_scale), ())
            out["scale"] = jnp.broadcast_to(jnp.exp(log_scale), u.shape[:1]).astype(jnp.float32)
            if self.negatives:
                out["negatives"] = jnp.stack([pool(e, batch[f"{p}attention_mask"], self.pooling)
                                              for e, p in zip(encoded[2:], self.negatives)], 1).astype(jnp.float32)
        elif self.loss == "cosine":
            out["logits"] = cosine(u, v).astype(jnp.float32)
        else:
            features = jnp.concatenate([u, v, jnp.abs(u - v)], -1)
            out["logits"] = Dense((3 * self.hidden_size,), (self.num_outputs,), (None, None),
                                  kernel_init=nn.initializers.normal(self.initializer_range),
                                  name="classifier")(features).astype(jnp.float32)
        return out


class SentenceEmbedding(Task):
    name = "sentence_embedding"

    def validate(self, task_cfg):
        if task_cfg.embedding_loss not in OBJECTIVES:
            raise ValueError(f"config.task.embedding_loss={task_cfg.embedding_loss!r}; expected one of "
                             f"{tuple(OBJECTIVES)}")
        if not task_cfg.temperature > 0:
            raise UserError(f"config.task.temperature={task_cfg.temperature!r} must be > 0")
        if task_cfg.negative_field and task_cfg.num_negatives < 1:
            raise UserError(f"config.task.num_negatives={task_cfg.num_negatives} with "
                            f"config.task.negative_field={task_cfg.negative_field!r}: at least 1")
        if (task_cfg.negative_field or matryoshka_dims(task_cfg)) and task_cfg.embedding_loss != "ranking":
            raise UserError(f"config.task.negative_field / matryoshka_dims are for embedding_loss='ranking', not "
                            f"{task_cfg.embedding_loss!r}")

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
        if split == "train" and task_cfg.negative_field:
            row["negatives"] = self._negatives(task_cfg, record, skipped)
            if row["negatives"] is None:
                return None
        return row

    def _negatives(self, task_cfg, record, skipped) -> list[str] | None:
        """A training row's hard negatives: its negative_field's text, or JSON list of texts (a CSV cell may hold
        one); a row with fewer than num_negatives is skipped, one with more trains on the first (both counted)."""
        value = data.field(record, task_cfg.negative_field, skipped)
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                pass
        texts = [str(t) for t in ([value] if isinstance(value, str) else value or []) if str(t).strip()]
        n = task_cfg.num_negatives
        if len(texts) < n:
            skipped[f"fewer than {n} negatives (config.task.num_negatives)"] += 1
            return None
        if len(texts) > n:
            skipped[f"more than {n} negatives: the first {n} used (config.task.num_negatives)"] += 1
        return texts[:n]

    def has_labels(self, task_cfg):
        return task_cfg.embedding_loss == "softmax"

    def labelled_splits(self, splits):
        return {"train": splits["train"]}  # softmax classes: evaluation reads scores, not classes

    def texts(self, task_cfg):
        return ("", "pair_") + negative_prefixes(task_cfg)

    def featurize(self, task_cfg, data_cfg, fast, rows, names):
        """Both texts of each pair; with hard negatives, each under its own prefix (an empty text in the splits
        that have none: evaluation reads u and v only)."""
        index = {n: i for i, n in enumerate(names)}
        out = {}
        for i, prefix in enumerate(("", "pair_")):
            out.update(data.encode(fast.encode_batch([row["texts"][i] for row in rows]), prefix))
        for i, prefix in enumerate(negative_prefixes(task_cfg)):
            out.update(data.encode(fast.encode_batch([row["negatives"][i] if row.get("negatives") else ""
                                                      for row in rows]), prefix))
        labels = [0 if row["label"] is None else index[row["label"]] if names else row["label"] for row in rows]
        out["labels"] = np.array(labels, np.int32 if names else np.float32)
        out["scores"] = np.array([np.nan if row["score"] is None else row["score"] for row in rows], np.float32)
        out["label_weights"] = np.ones(len(rows), np.float32)
        return out

    def build_head(self, family, model_cfg, task_cfg, num_outputs, has_family_pooler):
        return SiameseHead(loss=task_cfg.embedding_loss, pooling=task_cfg.pooling, num_outputs=num_outputs,
                           hidden_size=model_cfg.hidden_size,
                           initializer_range=float(model_cfg.get("initializer_range", 0.02)),
                           temperature=float(task_cfg.temperature), learn_temperature=bool(task_cfg.learn_temperature),
                           negatives=negative_prefixes(task_cfg))

    def objective(self, task_cfg):
        if task_cfg.embedding_loss == "ranking":
            return _loss_only(functools.partial(contrastive.ranking_loss_sums, dims=matryoshka_dims(task_cfg)))
        return OBJECTIVES[task_cfg.embedding_loss]

    def make_train_step(self, model, objective, tx, config):
        """With the ranking loss and train.grad_accum_steps > 1, GradCache: the encoder runs that many chunks at a
        time and the gradient is the whole batch's, every pair's negatives the whole batch (not its chunk's)."""
        chunks = config.train.grad_accum_steps
        if config.task.embedding_loss != "ranking" or chunks == 1:
            return super().make_train_step(model, objective, tx, config)
        if config.data.packing:
            raise UserError(f"config.train.grad_accum_steps={chunks} with embedding_loss='ranking' runs GradCache "
                            f"over unpacked chunks: set --config.data.packing=False")
        return make_train_step(model, objective, tx, 1, grads_fn=contrastive.grad_cache(model, objective, chunks))

    def evaluate(self, task_cfg, outputs, features, names, rows):
        """Spearman of cos(u, v) with the gold scores (SBERT's STS evaluation), and the in-batch-negatives
        ranking loss over the whole split as its loss (every other pair a negative)."""
        u, v = outputs["u"], outputs["v"]
        un = u / np.maximum(np.linalg.norm(u, axis=-1, keepdims=True), 1e-9)
        vn = v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-9)
        log_probs = np.asarray(jax.nn.log_softmax(un @ vn.T / task_cfg.temperature, -1))
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
