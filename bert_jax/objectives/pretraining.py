"""The families' pre-training objectives.

BERT: MLM + NSP, the loss being their sum (Devlin et al. 2019, §3.1).
RoBERTa: MLM alone; NSP was found not to help (Liu et al. 2019, §4.2).
ALBERT: MLM + SOP (Lan et al. 2020, §3.1).
"""
from bert_jax.objectives.mlm import mlm_sums, mlm_weights
from bert_jax.objectives.nsp import nsp_sums, nsp_weights
from bert_jax.objectives.objective import Objective
from bert_jax.objectives.sop import sop_sums, sop_weights


def _sums(outputs: dict, batch: dict) -> dict:
    return {
        **mlm_sums(outputs["mlm_logits"], batch["masked_ids"], batch["masked_weights"]),
        **nsp_sums(outputs["nsp_logits"], batch["next_sentence_label"]),
    }


def _weights(batch: dict) -> dict:
    return {**mlm_weights(batch["masked_weights"]), **nsp_weights(batch["next_sentence_label"])}


BERT_PRETRAINING = Objective(sums=_sums, weights=_weights, loss_terms=("mlm_loss", "nsp_loss"))

MLM_PRETRAINING = Objective(
    sums=lambda outputs, batch: mlm_sums(outputs["mlm_logits"], batch["masked_ids"], batch["masked_weights"]),
    weights=lambda batch: mlm_weights(batch["masked_weights"]),
    loss_terms=("mlm_loss",),
)


def _albert_sums(outputs: dict, batch: dict) -> dict:
    return {
        **mlm_sums(outputs["mlm_logits"], batch["masked_ids"], batch["masked_weights"]),
        **sop_sums(outputs["sop_logits"], batch["sentence_order_label"]),
    }


def _albert_weights(batch: dict) -> dict:
    return {**mlm_weights(batch["masked_weights"]), **sop_weights(batch["sentence_order_label"])}


ALBERT_PRETRAINING = Objective(sums=_albert_sums, weights=_albert_weights, loss_terms=("mlm_loss", "sop_loss"))
