"""Tagging (CoNLL NER, POS): a label per word, learnt and predicted on each word's first word-piece.

Rows come from CoNLL columns; `config.task.tagging` says how they are scored: bio (entity F1
per type, whole entities) or pos (token accuracy).
"""
import flax.linen as nn
import numpy as np

from bert_jax.finetune import data, metrics
from bert_jax.finetune.model import head_dense
from bert_jax.finetune.tasks import classification
from bert_jax.finetune.tasks.task import Task, nll

TAGGINGS = ("bio", "pos")


class TokenHead(nn.Module):
    """Logits of every word-piece: [batch, length, num_labels]."""

    num_outputs: int
    hidden_size: int
    dropout_rate: float
    initializer_range: float

    @nn.compact
    def __call__(self, encoded: list[dict], batch: dict, deterministic: bool) -> dict:
        hidden = nn.Dropout(self.dropout_rate)(encoded[0]["hidden"], deterministic=deterministic)
        logits = head_dense(self.hidden_size, self.num_outputs, self.initializer_range, "classifier")(hidden)
        return {"logits": logits.astype("float32")}


def word_tags(piece_labels: np.ndarray, features: dict, names: list[str]) -> list[list[str]]:
    """Per sentence, the tag at each (kept) word's first word-piece."""
    return [[names[row[p]] for p in positions if p >= 0]
            for row, positions in zip(piece_labels, features["word_positions"])]


class TokenClassification(Task):
    name = "token_classification"
    hf_class = "ForTokenClassification"

    def validate(self, task_cfg):
        if task_cfg.tagging not in TAGGINGS:
            raise ValueError(f"config.task.tagging={task_cfg.tagging!r}; expected one of {TAGGINGS}")

    def parse(self, task_cfg, record, split, skipped):
        if "ragged" in record:
            skipped["ragged CoNLL columns"] += 1
            return None
        cols = record["columns"]
        return {"words": cols[task_cfg.word_column], "tags": cols[task_cfg.tag_column]}

    def label_values(self, row):
        return row["tags"]

    def featurize(self, task_cfg, data_cfg, fast, rows, names):
        """Adds word_positions [n, length]: the word-piece index of each word's first piece, -1 past the words kept."""
        index = {n: i for i, n in enumerate(names)}
        encodings = fast.encode_batch([row["words"] for row in rows], is_pretokenized=True)
        out = data.encode(encodings)
        n, length = out["input_ids"].shape
        labels = np.zeros((n, length), np.int32)
        weights = np.zeros((n, length), np.float32)
        word_positions = np.full((n, length), -1, np.int32)
        for i, (row, enc) in enumerate(zip(rows, encodings)):
            seen = set()
            for position, word in enumerate(enc.word_ids):
                if word is None or word in seen:
                    continue  # specials, padding, and every piece after a word's first carry no label
                seen.add(word)
                labels[i, position] = index[row["tags"][word]]
                weights[i, position] = 1.0
                word_positions[i, word] = position
        out.update(labels=labels, label_weights=weights, word_positions=word_positions)
        return out

    def build_head(self, family, model_cfg, task_cfg, num_outputs, has_family_pooler):
        return TokenHead(num_outputs=num_outputs, hidden_size=model_cfg.hidden_size,
                         dropout_rate=float(model_cfg.dropout_rate),
                         initializer_range=float(model_cfg.get("initializer_range", 0.02)))

    def objective(self, task_cfg):
        return classification.OBJECTIVE  # classification over word-pieces: the same sums over [batch, length]

    def evaluate(self, task_cfg, outputs, features, names, rows):
        logits, labels = outputs["logits"], features["labels"]
        out = {"loss": nll(logits, labels, features["label_weights"])}
        predicted, gold = word_tags(logits.argmax(-1), features, names), word_tags(labels, features, names)
        if task_cfg.tagging != "pos":
            out.update(metrics.entity_metrics(predicted, gold))
        out.update(metrics.token_accuracy(predicted, gold))
        return out

    def headline_metric(self, task_cfg):
        return "token_accuracy" if task_cfg.tagging == "pos" else "entity_f1"

    def predictions(self, task_cfg, outputs, features, rows, names):
        tags = word_tags(outputs["logits"].argmax(-1), features, names)
        return [{"index": i, "words": row["words"][:len(t)], "tags": t} for i, (row, t) in enumerate(zip(rows, tags))]
