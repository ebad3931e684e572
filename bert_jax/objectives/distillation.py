"""Knowledge distillation's loss (Sanh et al. 2019, §2-3), as an Objective over student and teacher outputs.

The train step puts the frozen teacher's outputs under `outputs["frozen"]` (bert_jax/train/step.py).
Three terms, weighed by config.distill:
- kl_loss: T^2 * KL(teacher || student) of the temperature-T softened distributions at the
  masked positions (Hinton et al. 2015: T^2 keeps the gradients' scale independent of T);
- mlm_loss: the student's own cross-entropy on the masked tokens;
- cosine_loss: 1 - cos(student, teacher) of the last hidden states at every real token, as
  DistilBERT's CosineEmbeddingLoss; only where the hidden sizes match.
teacher_mlm_accuracy on the same batch shows the gap the student has to close.
"""
import jax
import jax.numpy as jnp
import optax

from bert_jax.objectives.mlm import mlm_sums, mlm_weights
from bert_jax.objectives.objective import Objective

FROZEN = "frozen"  # the step's key for the frozen network's outputs


def kl_sum(student_logits: jax.Array, teacher_logits: jax.Array, masked_weights: jax.Array,
           temperature: float) -> jax.Array:
    """T^2 * sum over predictions of KL(teacher_T || student_T), each weighted (padding predictions weigh 0)."""
    log_student = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    log_teacher = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    kl = optax.losses.kl_divergence_with_log_targets(log_student, log_teacher)
    return temperature**2 * jnp.sum(kl * masked_weights)


def cosine_sum(student_hidden: jax.Array, teacher_hidden: jax.Array, attention_mask: jax.Array) -> jax.Array:
    """Sum over real tokens of 1 - cos(student, teacher) of [batch, length, hidden] states."""
    distance = optax.losses.cosine_distance(student_hidden.astype(jnp.float32), teacher_hidden.astype(jnp.float32),
                                            epsilon=1e-8)
    return jnp.sum(distance * (attention_mask > 0))


def distillation_objective(distill_cfg, with_cosine: bool) -> Objective:
    """The Objective for config.distill; `with_cosine`: the student's and teacher's hidden sizes match."""
    temperature = float(distill_cfg.temperature)
    terms = ("kl_loss", "mlm_loss") + (("cosine_loss",) if with_cosine else ())
    scales = (float(distill_cfg.kl_weight), float(distill_cfg.mlm_weight)) + (
        (float(distill_cfg.cosine_weight),) if with_cosine else ())

    def sums(outputs: dict, batch: dict) -> dict:
        teacher, w = outputs[FROZEN], batch["masked_weights"]
        out = mlm_sums(outputs["mlm_logits"], batch["masked_ids"], w)
        out["kl_loss"] = kl_sum(outputs["mlm_logits"], teacher["mlm_logits"], w, temperature)
        out["teacher_mlm_accuracy"] = mlm_sums(teacher["mlm_logits"], batch["masked_ids"], w)["mlm_accuracy"]
        if with_cosine:
            out["cosine_loss"] = cosine_sum(outputs["last_hidden_state"], teacher["last_hidden_state"],
                                            batch["attention_mask"])
        return out

    def weights(batch: dict) -> dict:
        masked = mlm_weights(batch["masked_weights"])
        out = {**masked, "kl_loss": masked["mlm_loss"], "teacher_mlm_accuracy": masked["mlm_loss"]}
        if with_cosine:
            out["cosine_loss"] = jnp.sum((batch["attention_mask"] > 0).astype(jnp.float32))
        return out

    return Objective(sums=sums, weights=weights, loss_terms=terms, loss_scales=dict(zip(terms, scales, strict=True)),
                     headline=("mlm_accuracy", "teacher_mlm_accuracy"))
