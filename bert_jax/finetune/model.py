"""Task heads on a family's encoder (`Family.build_model(...).encode`): one module per run.

The encoder keeps the family module's parameter names under `backbone/` (the pre-training tree
minus the heads the task never calls), so a pre-training checkpoint or an HF import fills it
leaf by leaf. Heads live under `head/`, and mirror Hugging Face's so the export is a renaming:
a sequence head is `classifier` on the family's pooled [CLS] when it has a pooler (BERT,
ALBERT), else dense + tanh (`pooler`) then `classifier` (RobertaClassificationHead).
"""
import flax.linen as nn
import jax.numpy as jnp

from bert_jax.models.layers import Dense

SEQUENCE_KINDS = ("classification", "regression")
KINDS = SEQUENCE_KINDS + ("token_classification",)
POOLINGS = ("cls", "mean")


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

    @nn.compact
    def __call__(self, encoded: dict, attention_mask, deterministic: bool):
        dense = lambda n_out, name: Dense(  # noqa: E731
            (self.hidden_size,), (n_out,), ("embed", None),
            kernel_init=nn.initializers.normal(self.initializer_range), name=name)
        dropout = nn.Dropout(self.dropout_rate)
        hidden = encoded["hidden"]
        if self.kind == "token_classification":
            return dense(self.num_outputs, "classifier")(dropout(hidden, deterministic=deterministic))
        if self.pooling == "mean":
            pooled = mean_pool(hidden, attention_mask)
        elif self.has_family_pooler:
            pooled = encoded["pooled"]
        else:
            pooled = jnp.tanh(dense(self.hidden_size, "pooler")(dropout(hidden[:, 0], deterministic=deterministic)))
        return dense(self.num_outputs, "classifier")(dropout(pooled, deterministic=deterministic))


class FinetuneModel(nn.Module):
    """backbone: the family's module; __call__(batch, deterministic) -> {"logits": float32}.

    logits: [batch, num_labels] (classification), [batch, 1] (regression), [batch, length, num_labels] (tagging).
    """

    backbone: nn.Module
    head: TaskHead

    def __call__(self, batch: dict, deterministic: bool = True) -> dict:
        encoded = self.backbone.encode(batch, deterministic)
        logits = self.head(encoded, batch["attention_mask"], deterministic)
        return {"logits": logits.astype(jnp.float32)}


def build_finetune_model(family, model_cfg, task_cfg, num_outputs: int, has_family_pooler: bool) -> FinetuneModel:
    if task_cfg.kind not in KINDS:
        raise ValueError(f"config.task.kind={task_cfg.kind!r}; expected one of {KINDS}")
    if task_cfg.pooling not in POOLINGS:
        raise ValueError(f"config.task.pooling={task_cfg.pooling!r}; expected one of {POOLINGS}")
    head = TaskHead(kind=task_cfg.kind, num_outputs=num_outputs, pooling=task_cfg.pooling,
                    has_family_pooler=has_family_pooler, hidden_size=model_cfg.hidden_size,
                    dropout_rate=float(model_cfg.dropout_rate), initializer_range=float(model_cfg.initializer_range),
                    name="head")
    return FinetuneModel(backbone=family.build_model(model_cfg).clone(name="backbone"), head=head)
