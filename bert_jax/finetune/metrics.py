"""Task metrics on host numpy arrays, as the field computes them (sklearn's, seqeval's, SQuAD's)."""
import collections
import math

import numpy as np
from scipy import stats


def classification_metrics(predicted: np.ndarray, labels: np.ndarray, num_labels: int) -> dict:
    """accuracy, macro-F1 (over the labels present in either), Matthews correlation (multi-class, Gorodkin 2004);
    with two labels also `f1`, the F1 of the second (positive) label, as GLUE scores MRPC and QQP."""
    confusion = np.zeros((num_labels, num_labels), np.float64)
    np.add.at(confusion, (labels, predicted), 1)
    tp = np.diag(confusion)
    support, predicted_n = confusion.sum(1), confusion.sum(0)
    present = (support + predicted_n) > 0
    f1 = np.where(present, 2 * tp / np.maximum(support + predicted_n, 1), 0.0)
    n = confusion.sum()
    correct = tp.sum()
    cov = correct * n - support @ predicted_n
    denom = np.sqrt(n**2 - predicted_n @ predicted_n) * np.sqrt(n**2 - support @ support)
    out = {"accuracy": float(correct / max(n, 1)), "macro_f1": float(f1[present].mean()) if present.any() else 0.0,
           "matthews": float(cov / denom) if denom > 0 else 0.0}
    if num_labels == 2:
        out["f1"] = float(f1[1])
    return out


# Chance: what a model that learned nothing scores (the constant predictor a task's training rows suggest), and how
# far a score strays from it by luck on a validation set of n examples.
CORRELATIONS = ("matthews", "pearson", "spearman")  # in [-1, 1], 0 at chance
CHANCE_Z = 2.0  # standard errors: a score within this many of chance is not told apart from it


def chance_margin(metric: str, n: int, z: float = CHANCE_Z) -> float:
    """z standard errors of `metric` on n examples around chance: a correlation's is about 1 / sqrt(n) (near 0), a
    proportion's (accuracy, F1) at most 0.5 / sqrt(n). A score within it of chance is indistinguishable from a
    model that learned nothing: on SST-2's 872 dev sentences, accuracy 0.5 ± 0.034."""
    return z * (1.0 if metric in CORRELATIONS else 0.5) / math.sqrt(max(n, 1))


def at_chance(score: float, chance: float, margin: float, higher_is_better: bool = True) -> bool:
    """Whether `score` is no better than chance by more than `margin` (a score below chance learned nothing either)."""
    return (score - chance if higher_is_better else chance - score) <= margin


def regression_metrics(predicted: np.ndarray, labels: np.ndarray) -> dict:
    if np.std(predicted) == 0 or np.std(labels) == 0:  # a constant has no correlation
        return {"pearson": 0.0, "spearman": 0.0}
    return {"pearson": float(stats.pearsonr(predicted, labels)[0]),
            "spearman": float(stats.spearmanr(predicted, labels)[0])}


def bio_entities(tags: list[str]) -> set[tuple[str, int, int]]:
    """(type, first word, last word) of each entity in a BIO (or IOB1) tag sequence, as seqeval's default mode:
    an I- that follows O or another type opens an entity."""
    entities, current = set(), None
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, _, kind = tag.partition("-")
        if current is not None and (prefix in ("O", "B") or kind != current[0] or prefix not in ("I",)):
            entities.add((current[0], current[1], i - 1))
            current = None
        if prefix in ("B", "I") and current is None:
            current = (kind, i)
    return entities


def entity_metrics(predicted: list[list[str]], gold: list[list[str]]) -> dict:
    """Entity-level micro F1 (`entity_f1`) and precision / recall / F1 per entity type (`f1/PER`, ...)."""
    counts = collections.defaultdict(lambda: np.zeros(3))  # type -> (true positives, predicted, gold)
    for p_tags, g_tags in zip(predicted, gold):
        p, g = bio_entities(p_tags), bio_entities(g_tags)
        for kind, *_ in p:
            counts[kind][1] += 1
        for kind, *_ in g:
            counts[kind][2] += 1
        for kind, *_ in p & g:
            counts[kind][0] += 1
    out = {}

    def prf(tp, n_pred, n_gold):
        precision, recall = tp / max(n_pred, 1), tp / max(n_gold, 1)
        return precision, recall, 2 * precision * recall / max(precision + recall, 1e-12)

    for kind, (tp, n_pred, n_gold) in sorted(counts.items()):
        out[f"precision/{kind}"], out[f"recall/{kind}"], out[f"f1/{kind}"] = prf(tp, n_pred, n_gold)
    total = sum(counts.values()) if counts else np.zeros(3)
    out["entity_precision"], out["entity_recall"], out["entity_f1"] = prf(*total)
    return {k: float(v) for k, v in out.items()}


def token_accuracy(predicted: list[list[str]], gold: list[list[str]]) -> dict:
    pairs = [(p, g) for ps, gs in zip(predicted, gold) for p, g in zip(ps, gs)]
    return {"token_accuracy": float(np.mean([p == g for p, g in pairs])) if pairs else 0.0}
