"""Extractive QA, SQuAD-style (Rajpurkar et al. 2016, 2018): the JSON, doc-stride windows, the best span over
windows, and EM / F1 exactly as the official evaluation script computes them.

A context longer than the sequence is cut into windows of max_seq_length tokens that overlap by
`doc_stride` tokens. A window whose context part does not hold the whole answer learns "no
answer" at [CLS] (index 0), as do unanswerable questions (SQuAD 2.0). At evaluation, each
question's answer is the best-scoring span (start + end logits, start <= end, at most
max_answer_length tokens, inside the context) over all its windows, or "" when the [CLS]
score (the lowest over windows) beats it.
"""
import collections
import json
import re
import string

import numpy as np

from bert_jax.storage import paths


def read_squad(path: str) -> tuple[list[dict], collections.Counter]:
    """SQuAD v1.1 / v2.0 JSON -> rows {id, question, context, answers: [(text, start char)]}; an answer whose
    text is not at its `answer_start` in the context (or lies outside it) is skipped and counted."""
    p = paths.path(path)
    if not p.exists():
        raise ValueError(f"data file {path} does not exist")
    rows, skipped = [], collections.Counter()
    for article in json.loads(p.read_text(encoding="utf-8"))["data"]:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                answers = [(a["text"], int(a["answer_start"])) for a in qa.get("answers", [])]
                if not qa["question"].strip() or not context.strip():
                    skipped["empty text"] += 1
                    continue
                if any(start < 0 or start + len(text) > len(context) for text, start in answers):
                    skipped["answer outside its context"] += 1
                    continue
                if any(context[start:start + len(text)] != text for text, start in answers):
                    skipped["answer span not matching its context"] += 1
                    continue
                if not answers and not qa.get("is_impossible", False):
                    skipped["no answer and not marked is_impossible"] += 1
                    continue
                rows.append({"id": qa["id"], "question": qa["question"], "context": context, "answers": answers})
    return rows, skipped


def featurize(fast, rows: list[dict], doc_stride: int) -> dict:
    """Windows of (question, context): model inputs [windows, length], labels [windows, 2] (start, end token;
    0, 0 = no answer here), and for post-processing example_index [windows], offsets [windows, length, 2] (char
    spans in the context, -1 outside it)."""
    fast = type(fast).from_str(fast.to_str())
    length = fast.truncation["max_length"]
    fast.enable_truncation(length, stride=doc_stride, strategy="only_second")
    out = collections.defaultdict(list)
    for index, row in enumerate(rows):
        first = fast.encode(row["question"], row["context"])
        for window in [first] + list(first.overflowing):
            sequence = np.array([-1 if s is None else s for s in window.sequence_ids])
            offsets = np.array(window.offsets, np.int32)
            offsets[sequence != 1] = -1
            start = end = 0
            if row["answers"]:
                text, char_start = row["answers"][0]
                char_end = char_start + len(text)
                inside = np.nonzero(sequence == 1)[0]
                if offsets[inside[0], 0] <= char_start and offsets[inside[-1], 1] >= char_end:
                    start = int(inside[np.nonzero(offsets[inside, 0] <= char_start)[0][-1]])
                    end = int(inside[np.nonzero(offsets[inside, 1] >= char_end)[0][0]])
            out["input_ids"].append(window.ids)
            out["attention_mask"].append(window.attention_mask)
            out["token_type_ids"].append(window.type_ids)
            out["labels"].append((start, end))
            out["example_index"].append(index)
            out["offsets"].append(offsets)
    features = {k: np.array(v, np.int32) for k, v in out.items()}
    features["label_weights"] = np.ones(len(features["input_ids"]), np.float32)
    return features


def best_answers(start_logits: np.ndarray, end_logits: np.ndarray, features: dict, rows: list[dict],
                 max_answer_length: int) -> list[str]:
    """The predicted answer text of each row: the best span over its windows, or "" if no-answer scores higher."""
    best = [(-np.inf, "") for _ in rows]
    null = [np.inf for _ in rows]
    for w, index in enumerate(features["example_index"]):
        s, e, offsets = start_logits[w], end_logits[w], features["offsets"][w]
        null[index] = min(null[index], s[0] + e[0])
        valid = offsets[:, 0] >= 0
        scores = s[:, None] + e[None, :]
        i, j = np.meshgrid(np.arange(len(s)), np.arange(len(e)), indexing="ij")
        allowed = valid[:, None] & valid[None, :] & (j >= i) & (j - i + 1 <= max_answer_length)
        if not allowed.any():
            continue
        scores = np.where(allowed, scores, -np.inf)
        a, b = np.unravel_index(np.argmax(scores), scores.shape)
        if scores[a, b] > best[index][0]:
            context = rows[index]["context"]
            best[index] = (scores[a, b], context[offsets[a, 0]:offsets[b, 1]])
    return [text if score > null_score else "" for (score, text), null_score in zip(best, null)]


# The official SQuAD v2.0 evaluation script's normalisation and scores.
def normalize_answer(s: str) -> str:
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _f1(gold: str, predicted: str) -> float:
    gold_tokens, predicted_tokens = normalize_answer(gold).split(), normalize_answer(predicted).split()
    if not gold_tokens or not predicted_tokens:
        return float(gold_tokens == predicted_tokens)  # no-answer: 1 if both empty, else 0
    common = collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_metrics(predictions: list[str], rows: list[dict]) -> dict:
    """exact_match and f1 in [0, 1]: each the max over the gold answers ([""] for unanswerable), averaged."""
    em, f1 = [], []
    for predicted, row in zip(predictions, rows):
        golds = [text for text, _ in row["answers"] if normalize_answer(text)] or [""]
        em.append(max(float(normalize_answer(g) == normalize_answer(predicted)) for g in golds))
        f1.append(max(_f1(g, predicted) for g in golds))
    return {"exact_match": float(np.mean(em)), "f1": float(np.mean(f1))}
