"""BERT pre-training: MLM + NSP, the training loss being their sum (Devlin et al. 2019, §3.1)."""
from bert_jax.objectives.mlm import mlm_sums, mlm_weights
from bert_jax.objectives.nsp import nsp_sums, nsp_weights
from bert_jax.objectives.objective import Objective


def _sums(outputs: dict, batch: dict) -> dict:
    return {
        **mlm_sums(outputs["mlm_logits"], batch["masked_ids"], batch["masked_weights"]),
        **nsp_sums(outputs["nsp_logits"], batch["next_sentence_label"]),
    }


def _weights(batch: dict) -> dict:
    return {**mlm_weights(batch["masked_weights"]), **nsp_weights(batch["next_sentence_label"])}


BERT_PRETRAINING = Objective(sums=_sums, weights=_weights, loss_terms=("mlm_loss", "nsp_loss"))
