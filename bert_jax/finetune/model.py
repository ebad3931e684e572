"""The task model: a family's encoder (`Family.build_model(...).encode`) under a task's head, one module per run.

The encoder keeps the family module's parameter names under `backbone/` (the pre-training tree
minus the heads the task never calls), so a pre-training checkpoint or an HF import fills it
leaf by leaf. Heads (bert_jax/finetune/tasks/) live under `head/`, and mirror Hugging Face's so
the export is a renaming. The sequence head shared by classification and regression is here: `classifier`
on the family's pooled [CLS] when it has a pooler (BERT, ALBERT), else dense + the activation of the
family's HF head (`pooler`; tanh in RobertaClassificationHead, GELU in ELECTRA's and DeBERTa's, ReLU in
DistilBERT's: `HfConverter.classifier_head`) then `classifier`.
"""
import flax.linen as nn
import jax.numpy as jnp

from bert_jax.models.layers import ACTIVATIONS, Dense

POOLINGS = ("cls", "mean")
HEAD_ACTIVATIONS = {**ACTIVATIONS, "tanh": jnp.tanh, "relu": nn.relu}


def mean_pool(hidden, attention_mask):
    """hidden [batch, length, hidden], attention_mask [batch, length] -> the mean over real tokens [batch, hidden]."""
    mask = (attention_mask > 0).astype(hidden.dtype)[..., None]
    return (hidden * mask).sum(1) / jnp.maximum(mask.sum(1), 1.0)


def pool(encoded: dict, attention_mask, pooling: str):
    """A sentence's vector [batch, hidden]: its [CLS] state, or the mean of its tokens' states."""
    return mean_pool(encoded["hidden"], attention_mask) if pooling == "mean" else encoded["hidden"][:, 0]


def head_dense(n_in: int, n_out: int, initializer_range: float, name: str) -> Dense:
    return Dense((n_in,), (n_out,), ("embed", None), kernel_init=nn.initializers.normal(initializer_range), name=name)


class SequenceHead(nn.Module):
    """One vector of outputs per example: [batch, num_outputs]."""

    num_outputs: int
    pooling: str
    has_family_pooler: bool
    hidden_size: int
    dropout_rate: float
    initializer_range: float
    pooler_activation: str = "tanh"

    @nn.compact
    def __call__(self, encoded: list[dict], batch: dict, deterministic: bool) -> dict:
        dropout = nn.Dropout(self.dropout_rate)
        (text,) = encoded
        if self.pooling == "mean":
            pooled = mean_pool(text["hidden"], batch["attention_mask"])
        elif self.has_family_pooler:
            pooled = text["pooled"]
        else:
            activation = HEAD_ACTIVATIONS[self.pooler_activation]
            dense = head_dense(self.hidden_size, self.hidden_size, self.initializer_range, "pooler")
            pooled = activation(dense(dropout(text["hidden"][:, 0], deterministic=deterministic)))
        classifier = head_dense(self.hidden_size, self.num_outputs, self.initializer_range, "classifier")
        return {"logits": classifier(dropout(pooled, deterministic=deterministic)).astype(jnp.float32)}


def text_inputs(batch: dict, prefix: str) -> dict:
    """The encoder's inputs of one text of each example: the batch's keys under `prefix` ("" or "pair_")."""
    return batch if not prefix else {k[len(prefix):]: v for k, v in batch.items() if k.startswith(prefix)}


class FinetuneModel(nn.Module):
    """backbone: the family's module; head(encoded texts, batch, deterministic) -> {"logits": float32, ...}."""

    backbone: nn.Module
    head: nn.Module
    texts: tuple[str, ...] = ("",)  # the feature prefixes of the texts each example has (pairs: "", "pair_")
    pooling: str = "cls"  # how `embed` makes a sentence's vector (config.task.pooling)

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
        """Sentence embeddings [batch, hidden] of one text per example: what a sentence-transformers export gives."""
        return pool(self.encode(batch, deterministic), batch["attention_mask"], self.pooling)

    def __call__(self, batch: dict, deterministic: bool = True) -> dict:
        encoded = [self.encode(text_inputs(batch, prefix), deterministic) for prefix in self.texts]
        return self.head(encoded, batch, deterministic)
