"""Replaced-token detection (Clark et al. 2020): a generator and a discriminator in one module, one forward.

A family subclasses `ReplacedTokenDetection` and supplies its two networks in `setup`:

    generator_logits(batch, deterministic)     -> [batch, predictions, vocab] at batch["masked_positions"]
    discriminator_logits(batch, deterministic) -> [batch, length], > 0 = "replaced"

and chooses how they share embeddings: one embedding module given to both (ELECTRA §3.2), or
`GradientDisentangledEmbed` over the generator's table (DeBERTa-v3's GDES, He et al. 2023 §3.2).
The forward then (1) runs the generator at the masked positions, (2) samples replacements from
its softmax at `sampling_temperature()` under the `sample` rng stream (bert_jax.train.step derives it like
every other key, so resume repeats the draw), as a stop-gradient, (3) runs the discriminator on
the corrupted ids and (4) labels every token replaced or original, for the objective in
bert_jax.objectives.replaced_token_detection.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from bert_jax.models.layers import Embed, EncoderModel, logical


def corrupt_masked_tokens(input_ids: jax.Array, masked_positions: jax.Array, masked_ids: jax.Array,
                          masked_weights: jax.Array, sampled_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The discriminator's input and labels.

    input_ids: [batch, length] (the generator's, masked); masked_positions, masked_ids, masked_weights,
    sampled_ids: [batch, predictions]. Real predictions (weight > 0) put their sample at their
    position; every other position gets its original token back (masked_ids where masked).
    Returns corrupted ids [batch, length] int32 and labels [batch, length] float32: 1 where the
    corrupted token differs from the original, so a correct sample counts as original.
    Padding predictions (weight 0, position 0 by the pipeline's convention) write nothing: the
    scatters take the max with 0-valued entries, and token ids are >= 0.
    """
    real = masked_weights > 0
    rows = jnp.arange(input_ids.shape[0])[:, None]
    scatter = lambda values: jnp.zeros_like(input_ids).at[rows, masked_positions].max(  # noqa: E731
        jnp.where(real, values, 0).astype(input_ids.dtype))
    selected = scatter(jnp.ones_like(masked_positions)) > 0
    original = jnp.where(selected, scatter(masked_ids), input_ids)
    corrupted = jnp.where(selected, scatter(sampled_ids), input_ids)
    return corrupted.astype(jnp.int32), (corrupted != original).astype(jnp.float32)


def sample_replacements(mlm_logits: jax.Array, key: jax.Array, temperature: float) -> jax.Array:
    """mlm_logits [batch, predictions, vocab] -> sampled ids [batch, predictions], with no gradient."""
    logits = jax.lax.stop_gradient(mlm_logits.astype(jnp.float32)) / temperature
    return jax.random.categorical(key, logits, axis=-1)


class ReplacedTokenDetection(EncoderModel):
    """The generic two-network forward. A family subclasses it and defines `setup` and
    `generator_logits(batch, deterministic)` -> [batch, predictions, vocab] at the gathered masked
    positions, and `discriminator_logits(batch, deterministic)` -> [batch, length] on the corrupted
    ids (and `sampling_temperature`, if not 1.0 as in ELECTRA), and `hidden_states` (EncoderModel's) of the
    network fine-tuning starts from, the discriminator."""

    def sampling_temperature(self) -> float:
        """The temperature of the generator's softmax when sampling replacements."""
        return 1.0


    def sample_key(self) -> jax.Array:
        if self.is_initializing() and not self.has_rng("sample"):
            return jax.random.key(0)  # init only builds params: the draw does not matter
        if not self.has_rng("sample"):
            raise ValueError("replaced-token detection samples the generator's replacements: apply the model with "
                             "rngs={'sample': key} (bert_jax.train.step does)")
        return self.make_rng("sample")

    def masked_lm_logits(self, batch: dict, deterministic: bool = True) -> jax.Array:
        """The generator's: its MLM head is the model's only one (fill-mask), and runs without a sample."""
        return self.generator_logits(batch, deterministic).astype(jnp.float32)

    def __call__(self, batch: dict, deterministic: bool = True) -> dict:
        """batch: the pipeline's dict (input_ids masked, attention_mask, masked_positions, masked_ids,
        masked_weights, ...). Returns mlm_logits [batch, predictions, vocab], rtd_logits [batch, length]
        (float32), rtd_labels [batch, length] (1 = replaced) and the corrupted input_ids."""
        mlm_logits = self.generator_logits(batch, deterministic)
        sampled = sample_replacements(mlm_logits, self.sample_key(), self.sampling_temperature())
        corrupted, labels = corrupt_masked_tokens(batch["input_ids"], batch["masked_positions"],
                                                  batch["masked_ids"], batch["masked_weights"], sampled)
        rtd_logits = self.discriminator_logits({**batch, "input_ids": corrupted}, deterministic)
        return {"mlm_logits": mlm_logits.astype(jnp.float32), "rtd_logits": rtd_logits.astype(jnp.float32),
                "rtd_labels": labels, "corrupted_ids": corrupted}


class GradientDisentangledEmbed(nn.Module):
    """GDES (He et al. 2023, §3.2): the discriminator's table = stop_gradient(the generator's) + its own delta.

    `shared` is the generator's Embed; the delta (same shape, zero-initialised) is this module's
    parameter `delta`. The discriminator's loss so reaches the delta only, never the shared table;
    what a checkpoint of the discriminator holds is the sum (`merged_table`).
    """

    shared: Embed

    def setup(self):
        self.delta = self.param("delta", logical(nn.initializers.zeros, self.shared.axes),
                                (self.shared.num_embeddings, self.shared.features), self.shared.param_dtype)

    def merged_table(self) -> jax.Array:
        return jax.lax.stop_gradient(self.shared.embedding) + self.delta

    def __call__(self, ids: jax.Array) -> jax.Array:
        """The merged table's rows at ids, gathered from each table and added: the same float32 sum as
        take(merged_table()), without writing a [vocab, hidden] sum per step to gather a batch's rows from
        (DeBERTa-v3-base's 128K x 768: 120 kB of HBM traffic per token of a 16 x 512 micro-batch)."""
        rows = lambda table: jnp.take(nn.with_logical_constraint(table, (self.shared.axes[0], None)), ids, axis=0)  # noqa: E731
        return (rows(jax.lax.stop_gradient(self.shared.embedding)) + rows(self.delta)).astype(self.shared.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        dtype = self.shared.dtype
        return jnp.einsum("...e,ve->...v", x.astype(dtype), self.merged_table().astype(dtype))
