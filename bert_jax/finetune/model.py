"""Task heads on a family's encoder (`Family.build_model(...).encode`): one module per run.

The encoder keeps the family module's parameter names under `backbone/` (the pre-training tree
minus the heads the task never calls), so a pre-training checkpoint or an HF import fills it
leaf by leaf. Heads live under `head/`, and mirror Hugging Face's so the export is a renaming:
a sequence head is `classifier` on the family's pooled [CLS] when it has a pooler (BERT,
ALBERT), else dense + the activation of the family's HF head (`pooler`; tanh in RobertaClassificationHead,
GELU in ELECTRA's and DeBERTa's, ReLU in DistilBERT's: `Family.hf_classifier_head`) then `classifier`.
"""
import flax.linen as nn
import jax.numpy as jnp

from bert_jax.models.layers import ACTIVATIONS, Dense

SEQUENCE_KINDS = ("classification", "regression")
KINDS = SEQUENCE_KINDS + ("token_classification", "span_qa", "sentence_embedding")
EMBEDDING_LOSSES = ("ranking", "cosine", "softmax")
# SBERT's MultipleNegativesRankingLoss multiplies cosine similarities by 20 before the softmax.
RANKING_SCALE = 20.0
POOLINGS = ("cls", "mean")
HEAD_ACTIVATIONS = {**ACTIVATIONS, "tanh": jnp.tanh, "relu": nn.relu}


def mean_pool(hidden, attention_mask):
    """hidden [batch, length, hidden], attention_mask [batch, length] -> the mean over real tokens [batch, hidden]."""
    mask = (attention_mask > 0).astype(hidden.dtype)[..., None]
    return (hidden * mask).sum(1) / jnp.maximum(mask.sum(1), 1.0)


class TaskHead(nn.Module):
    kind: str
    num_outputs: int
    pooling: str
    has_family_pooler: bool
    hidden_size: int
    dropout_rate: float
    initializer_range: float
    pooler_activation: str = "tanh"

    @nn.compact
    def __call__(self, encoded: dict, attention_mask, deterministic: bool):
        dense = lambda n_out, name: Dense(  # noqa: E731
            (self.hidden_size,), (n_out,), ("embed", None),
            kernel_init=nn.initializers.normal(self.initializer_range), name=name)
        dropout = nn.Dropout(self.dropout_rate)
        hidden = encoded["hidden"]
        if self.kind == "span_qa":  # start and end logits of every token (HF's qa_outputs)
            return dense(2, "qa_outputs")(hidden)
        if self.kind == "token_classification":
            return dense(self.num_outputs, "classifier")(dropout(hidden, deterministic=deterministic))
        if self.pooling == "mean":
            pooled = mean_pool(hidden, attention_mask)
        elif self.has_family_pooler:
            pooled = encoded["pooled"]
        else:
            activation = HEAD_ACTIVATIONS[self.pooler_activation]
            pooled = activation(dense(self.hidden_size, "pooler")(dropout(hidden[:, 0], deterministic=deterministic)))
        return dense(self.num_outputs, "classifier")(dropout(pooled, deterministic=deterministic))


def cosine(u, v):
    return jnp.sum(u * v, -1) / jnp.maximum(jnp.linalg.norm(u, axis=-1) * jnp.linalg.norm(v, axis=-1), 1e-9)


class SiameseHead(nn.Module):
    """SBERT (Reimers & Gurevych 2019): embeddings u, v of the two sentences by one encoder, then per loss:
    ranking -> scaled cosine of every u with every v [batch, batch] (in-batch negatives); cosine -> cos(u, v)
    [batch]; softmax -> classifier over (u, v, |u - v|) [batch, num_labels]."""

    loss: str
    num_outputs: int
    hidden_size: int
    initializer_range: float

    @nn.compact
    def __call__(self, u, v):
        if self.loss == "ranking":
            un = u / jnp.maximum(jnp.linalg.norm(u, axis=-1, keepdims=True), 1e-9)
            vn = v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-9)
            return RANKING_SCALE * un @ vn.T
        if self.loss == "cosine":
            return cosine(u, v)
        features = jnp.concatenate([u, v, jnp.abs(u - v)], -1)
        return Dense((3 * self.hidden_size,), (self.num_outputs,), (None, None),
                     kernel_init=nn.initializers.normal(self.initializer_range), name="classifier")(features)


class FinetuneModel(nn.Module):
    """backbone: the family's module; __call__(batch, deterministic) -> {"logits": float32}.

    logits: [batch, num_labels] (classification), [batch, 1] (regression), [batch, length, num_labels] (tagging),
    [batch, length, 2] (span QA: start, end).
    """

    backbone: nn.Module
    head: nn.Module
    pooling: str = "cls"

    def encode(self, batch: dict, deterministic: bool = True) -> dict:
        """The backbone's `encode` in the batch's example layout: hidden [batch, length, hidden] (and pooled).

        A packed batch (bert_jax.finetune.data.pack_examples) runs the encoder on its packed
        rows and gathers each example's tokens back from `example_starts`; past an example's
        end the gathered states belong to others, which its attention_mask and label weights
        ignore, as they ignore padding. The family's pooler then runs on each example's own
        [CLS] (`pool`), not on the first token of a row.
        """
        if "packed_input_ids" not in batch:
            return self.backbone.encode(batch, deterministic)
        packed = {k[len("packed_"):]: v for k, v in batch.items() if k.startswith("packed_")}
        encoded = self.backbone.encode(packed, deterministic)
        rows, length, width = encoded["hidden"].shape
        index = batch["example_starts"][:, None] + jnp.arange(batch["attention_mask"].shape[1])
        hidden = jnp.take(encoded["hidden"].reshape(rows * length, width), index, axis=0, mode="clip")
        if "pooled" not in encoded:  # a family without a pooler
            return {"hidden": hidden}
        return {"hidden": hidden, "pooled": self.backbone.pool(hidden[:, 0])}

    def embed(self, batch: dict, deterministic: bool = True):
        """Sentence embeddings [batch, hidden]: the pooled encoder output."""
        hidden = self.encode(batch, deterministic)["hidden"]
        return mean_pool(hidden, batch["attention_mask"]) if self.pooling == "mean" else hidden[:, 0]

    def __call__(self, batch: dict, deterministic: bool = True) -> dict:
        if isinstance(self.head, SiameseHead):
            pair = {k[len("pair_"):]: v for k, v in batch.items() if k.startswith("pair_")}
            u, v = self.embed(batch, deterministic), self.embed(pair, deterministic)
            return {"logits": self.head(u, v).astype(jnp.float32), "u": u.astype(jnp.float32),
                    "v": v.astype(jnp.float32)}
        encoded = self.encode(batch, deterministic)
        logits = self.head(encoded, batch["attention_mask"], deterministic)
        return {"logits": logits.astype(jnp.float32)}


def build_finetune_model(family, model_cfg, task_cfg, num_outputs: int,
                         has_family_pooler: bool | None = None) -> FinetuneModel:
    """has_family_pooler: whether the encoder pools [CLS] itself; it is what the family declares
    (`Family.roles.pooler`), and a caller's answer that contradicts it fails."""
    declared = family.roles.pooler is not None
    if has_family_pooler is not None and has_family_pooler != declared:
        raise ValueError(f"config.model.family={family.name!r} declares {'a' if declared else 'no'} pooler, but the "
                         f"pre-trained parameters {'lack' if declared else 'hold'} one")
    if task_cfg.kind not in KINDS:
        raise ValueError(f"config.task.kind={task_cfg.kind!r}; expected one of {KINDS}")
    if task_cfg.pooling not in POOLINGS:
        raise ValueError(f"config.task.pooling={task_cfg.pooling!r}; expected one of {POOLINGS}")
    backbone = family.build_model(model_cfg).clone(name="backbone")
    if task_cfg.kind == "sentence_embedding":
        if task_cfg.embedding_loss not in EMBEDDING_LOSSES:
            raise ValueError(f"config.task.embedding_loss={task_cfg.embedding_loss!r}; expected one of "
                             f"{EMBEDDING_LOSSES}")
        head = SiameseHead(loss=task_cfg.embedding_loss, num_outputs=num_outputs, hidden_size=model_cfg.hidden_size,
                           initializer_range=float(model_cfg.get("initializer_range", 0.02)), name="head")
        return FinetuneModel(backbone=backbone, head=head, pooling=task_cfg.pooling)
    head = TaskHead(kind=task_cfg.kind, num_outputs=num_outputs, pooling=task_cfg.pooling,
                    has_family_pooler=declared, hidden_size=model_cfg.hidden_size,
                    dropout_rate=float(model_cfg.dropout_rate), initializer_range=float(model_cfg.get("initializer_range", 0.02)),
                    pooler_activation=family.hf_classifier_head.activation, name="head")
    return FinetuneModel(backbone=backbone, head=head, pooling=task_cfg.pooling)
