"""Building blocks shared by the encoder families.

Every parameter carries logical axis names (`embed`, `heads`, `kv`, `mlp`, `vocab`)
so that the mesh rules in the config, never the model, decide how it is sharded.
"""
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax import UserError
from bert_jax.kernels import dropout_add_layer_norm, lean_backward

Dtype = Any
Initializer = Callable[..., jax.Array]


def logical(init: Initializer, names: Sequence[str | None]) -> Initializer:
    return nn.with_logical_partitioning(init, tuple(names))


class Dense(nn.Module):
    """A dense layer whose kernel may have several input and output axes.

    `kernel_axes` names the kernel's axes: the first `len(in_shape)` contract with
    the input's trailing axes, the rest are `out_shape`. It is written with
    `self.param` + `jnp.einsum` rather than `nn.DenseGeneral` because the latter,
    with multi-dimensional kernels and logical partitioning, fails under
    `jax.set_mesh` (flax issue 3676).
    """

    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    kernel_axes: tuple[str | None, ...]
    use_bias: bool = True
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.normal(0.02)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        n_in, n_out = len(self.in_shape), len(self.out_shape)
        assert len(self.kernel_axes) == n_in + n_out, (self.kernel_axes, self.in_shape, self.out_shape)
        kernel = self.param(
            "kernel",
            logical(self.kernel_init, self.kernel_axes),
            self.in_shape + self.out_shape,
            self.param_dtype,
        )
        letters = "abcdefghijklmnopqrstuvwxyz"
        batch = letters[: x.ndim - n_in]
        contract = letters[x.ndim - n_in : x.ndim]
        out = letters[x.ndim : x.ndim + n_out]
        y = jnp.einsum(
            f"{batch}{contract},{contract}{out}->{batch}{out}",
            x.astype(self.dtype),
            kernel.astype(self.dtype),
        )
        if self.use_bias:
            bias = self.param(
                "bias", logical(nn.initializers.zeros, self.kernel_axes[n_in:]), self.out_shape, self.param_dtype
            )
            y = y + bias.astype(self.dtype)
        return y


class LayerNorm(nn.Module):
    """LayerNorm with named parameters; statistics are computed in float32. flax's LayerNorm's forward and
    parameters (`norm/scale`, `norm/bias`), with a backward that keeps only the input
    (bert_jax/kernels/lean_backward.py)."""

    epsilon: float = 1e-12
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    use_bias: bool = True  # False: scale only (ModernBERT's norm_bias=False)

    @nn.compact
    def __call__(self, x: jax.Array, h: jax.Array | None = None, dropout_key: jax.Array | None = None,
                 dropout_rate: float = 0.0) -> jax.Array:
        """LayerNorm(x); with h, LayerNorm(x + dropout(h)) in one custom VJP that keeps no dropout mask
        (bert_jax/kernels/dropout_add_layer_norm.py; the mask of `dropout_key`, at dropout_rate > 0)."""
        return _Norm(self.epsilon, self.dtype, self.param_dtype, self.use_bias, name="norm")(x, h, dropout_key,
                                                                                            dropout_rate)


class _Norm(nn.Module):
    epsilon: float
    dtype: Dtype
    param_dtype: Dtype
    use_bias: bool

    @nn.compact
    def __call__(self, x: jax.Array, h: jax.Array | None, dropout_key: jax.Array | None,
                 dropout_rate: float) -> jax.Array:
        features = (x.shape[-1],)
        scale = self.param("scale", logical(nn.initializers.ones, ("embed",)), features, self.param_dtype)
        bias = (self.param("bias", logical(nn.initializers.zeros, ("embed",)), features, self.param_dtype)
                if self.use_bias else None)
        if h is not None:
            return dropout_add_layer_norm.dropout_add_layer_norm(x, h, dropout_key, scale, bias, dropout_rate,
                                                                 self.epsilon, jnp.dtype(self.dtype))
        return lean_backward.layer_norm(x, scale, bias, self.epsilon, jnp.dtype(self.dtype))


class DropoutKey(nn.Module):
    """The key an `nn.Dropout` placed here (this name, this scope) would draw its mask from: flax folds the module's
    path into its rng, so naming this `Dropout_0` where `nn.Dropout` was the first dropout gives its masks."""

    rng_collection: str = "dropout"

    @nn.compact
    def __call__(self) -> jax.Array:
        return self.make_rng(self.rng_collection)


class Embed(nn.Module):
    """A lookup table that can also be used as a tied output projection (`attend`)."""

    num_embeddings: int
    features: int
    axes: tuple[str | None, str | None] = ("vocab", "embed")
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    embedding_init: Initializer = nn.initializers.normal(0.02)

    def setup(self):
        self.embedding = self.param(
            "embedding",
            logical(self.embedding_init, self.axes),
            (self.num_embeddings, self.features),
            self.param_dtype,
        )

    def __call__(self, ids: jax.Array) -> jax.Array:
        # The table's embed axis is gathered first (FSDP's per-use all-gather, as for
        # every weight): a lookup into an embed-sharded table makes XLA replicate its
        # [batch, length, embed] output to re-split it by batch ("involuntary full
        # rematerialization" under meshes with data and fsdp > 1).
        table = nn.with_logical_constraint(self.embedding, (self.axes[0], None))
        return jnp.take(table, ids, axis=0).astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """x: [..., features] -> [..., num_embeddings] scores against every row."""
        return jnp.einsum("...e,ve->...v", x.astype(self.dtype), self.embedding.astype(self.dtype))


def gelu(x: jax.Array) -> jax.Array:
    """The exact (erf) GELU of the original BERT, so exported weights match Hugging Face's `gelu`; its backward keeps
    only x (bert_jax/kernels/lean_backward.py)."""
    return lean_backward.gelu(x)


# config.model.hidden_act -> function, named as Hugging Face names them ("gelu_new": the tanh
# approximation, ALBERT v2's default).
ACTIVATIONS = {"gelu": gelu, "gelu_new": lambda x: nn.gelu(x, approximate=True)}


def gather_positions(hidden: jax.Array, positions: jax.Array) -> jax.Array:
    """hidden: [batch, length, hidden], positions: [batch, predictions] -> [batch, predictions, hidden]."""
    return jnp.take_along_axis(hidden, positions[..., None], axis=1)


class MaskedLMHead(nn.Module):
    """The masked-LM head every family shares: transform, activation, LayerNorm, then the decoder tied to the
    word table plus a bias, only at the gathered masked positions (predictions x vocab, not length x vocab).

    Its parent adopts it with `nn.share_scope(parent, head)`, so its parameters sit beside the encoder under
    the names checkpoints and the HF converters know (`mlm_transform`, `mlm_norm`, `mlm_output_bias`;
    ModernBERT's `head_dense`, `head_norm`).
    """

    features: int  # the transform's output: hidden size, or E where the word table is factorised
    vocab_size: int
    activation: str  # a key of ACTIVATIONS
    layer_norm_eps: float
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    kernel_init: Initializer = nn.initializers.normal(0.02)
    transform_bias: bool = True
    norm_bias: bool = True
    decoder_bias: bool = True
    transform_name: str = "mlm_transform"
    norm_name: str = "mlm_norm"

    @nn.compact
    def __call__(self, hidden: jax.Array, masked_positions: jax.Array, word) -> jax.Array:
        """hidden [batch, length, hidden], masked_positions [batch, predictions], `word` the tied table (Embed's
        `attend`) -> float32 logits [batch, predictions, vocab]. masked_positions None: every position (a causal
        LM's head), [batch, length, vocab]."""
        # Predictions split over the context axis as the sequence is ("length"): each device of a context group
        # runs the head on its share of the row's masked positions, not all of them (no-op at context 1).
        h = hidden if masked_positions is None else gather_positions(hidden, masked_positions)
        h = nn.with_logical_constraint(h, ("batch", "length", "embed"))
        h = Dense((h.shape[-1],), (self.features,), ("embed", None), use_bias=self.transform_bias, dtype=self.dtype,
                  param_dtype=self.param_dtype, kernel_init=self.kernel_init, name=self.transform_name)(h)
        h = LayerNorm(self.layer_norm_eps, self.dtype, self.param_dtype, self.norm_bias,
                      name=self.norm_name)(ACTIVATIONS[self.activation](h))
        logits = word.attend(h)
        if self.decoder_bias:
            bias = self.param("mlm_output_bias", logical(nn.initializers.zeros, ("vocab",)), (self.vocab_size,),
                              self.param_dtype)
            logits = logits + bias.astype(self.dtype)
        return nn.with_logical_constraint(logits.astype(jnp.float32), ("batch", "length", "vocab"))


class EncoderModel(nn.Module):
    """A family's module as task heads see it: `encode(batch)` -> {"hidden": [batch, length, hidden]}, plus
    "pooled" [batch, hidden] (tanh(dense([CLS])), BERT's pooler) when the module has a `pooler` submodule.

    A family defines `hidden_states(batch, deterministic)`, its encoder's call, which its own `__call__` uses
    too; the family's `ParamRoles.pooler` declares the pooler (tests/test_family_conformance.py holds the two
    together).
    """

    def hidden_states(self, batch: dict, deterministic: bool) -> jax.Array:
        raise NotImplementedError(f"{type(self).__name__} defines no hidden_states(batch, deterministic)")

    def encode(self, batch: dict, deterministic: bool = True) -> dict:
        """The encoder without the pre-training heads, for task heads (bert_jax.finetune)."""
        hidden = self.hidden_states(batch, deterministic)
        if getattr(self, "pooler", None) is None:
            return {"hidden": hidden}
        return {"hidden": hidden, "pooled": self.pool(hidden[:, 0])}

    def masked_lm_logits(self, batch: dict, deterministic: bool = True) -> jax.Array:
        """The MLM head's float32 logits [batch, predictions, vocab] at batch["masked_positions"], from the inputs
        alone (input_ids, attention_mask, token_type_ids): what fill-mask reads (bert_jax/inspect), no objective's
        own keys. A family whose __call__ needs more (a generator's samples) says how its MLM head runs without."""
        outputs = self(batch, deterministic)
        if "mlm_logits" not in outputs:  # a causally trained model's head predicts the next token, not a mask
            raise UserError(f"fill-mask reads a masked-LM head; this {type(self).__name__} gives {sorted(outputs)} "
                            f"(a causally trained checkpoint continues text: --mode=generate)")
        return outputs["mlm_logits"]

    def pool(self, first_token: jax.Array) -> jax.Array:
        """[batch, hidden] [CLS] states -> tanh(dense(.)); fine-tuning on packed rows calls it on each example's
        own [CLS]."""
        return jnp.tanh(self.pooler(first_token))
