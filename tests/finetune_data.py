"""Made, learnable fine-tuning data and a tiny random Hugging Face BERT folder to start from, in tmp dirs."""
import csv
import os
import random

import numpy as np

POSITIVE = "good great fine nice happy bright".split()
NEGATIVE = "bad awful poor sad dark grim".split()
FILLER = "the a of to in is and for with this it was".split()
PEOPLE = "alice bob carol dave".split()
PLACES = "paris london rome oslo".split()
VOCAB_WORDS = sorted(set(POSITIVE + NEGATIVE + FILLER + PEOPLE + PLACES + ["went", "met", "saw", "visited", "where", "did", "go", "."]))


def sentiment_rows(n: int, seed: int) -> list[dict]:
    """`sentence`, `label` (neg/pos) and a `score` (the share of positive words) per row."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        positive = i % 2 == 1
        cue = [rng.choice(POSITIVE if positive else NEGATIVE) for _ in range(2)]
        words = cue + [rng.choice(FILLER) for _ in range(rng.randint(3, 6))]
        rng.shuffle(words)
        rows.append({"sentence": " ".join(words), "label": "pos" if positive else "neg",
                     "score": f"{float(positive) + 0.1 * rng.random():.3f}"})
    return rows


def write_csv(path, rows: list[dict], fields=("sentence", "label", "score")) -> str:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, list(fields), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return str(path)


def ner_sentences(n: int, seed: int) -> list[list[tuple[str, str]]]:
    """Sentences of (word, BIO tag): people are PER, places LOC (two-word places make I- tags)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = []
        for _ in range(rng.randint(3, 6)):
            r = rng.random()
            if r < 0.2:
                words.append((rng.choice(PEOPLE), "B-PER"))
            elif r < 0.3:
                words += [(rng.choice(PLACES), "B-LOC"), (rng.choice(PLACES), "I-LOC")]
            elif r < 0.4:
                words.append((rng.choice(PLACES), "B-LOC"))
            else:
                words.append((rng.choice(FILLER + ["went", "met", "saw", "visited"]), "O"))
        out.append(words)
    return out


def write_conll(path, sentences) -> str:
    with open(path, "w") as f:
        f.write("-DOCSTART- O\n\n")
        for sentence in sentences:
            f.write("".join(f"{w} NN {t}\n" for w, t in sentence) + "\n")
    return str(path)


def write_tiny_hf_bert(out: str, seed: int = 0) -> str:
    """A random-init transformers BertForPreTraining (hidden 32, 2 layers) with a WordPiece tokenizer over the
    made data's words, saved as a Hugging Face folder."""
    import torch
    import transformers

    from data_pipelines.tokenizers.kinds import HfTokenizer, get_kind
    from data_pipelines.tokenizers.wordpiece import bert_wordpiece

    specials = get_kind("wordpiece").specials
    vocab = list(specials.all()) + VOCAB_WORDS + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + list(
        "abcdefghijklmnopqrstuvwxyz.,")
    vocab = list(dict.fromkeys(vocab))
    tokenizer = HfTokenizer("wordpiece", bert_wordpiece({t: i for i, t in enumerate(vocab)}),
                            specials)
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)
    transformers.BertForPreTraining(cfg).save_pretrained(out)
    tokenizer.save(out)
    np.testing.assert_(os.path.exists(os.path.join(out, "tokenizer.json")))
    return out


def squad_json(n: int, seed: int, unanswerable: float = 0.25) -> dict:
    """SQuAD 2.0 JSON: contexts of filler sentences (longer than one window) around one 'X went to P .', the
    question 'where did X go' answered by P; or (no answer) contexts where X goes nowhere."""
    rng = random.Random(seed)
    paragraphs = []
    for i in range(n):
        person = rng.choice(PEOPLE)
        impossible = rng.random() < unanswerable
        sentences = [" ".join(rng.choice(FILLER) for _ in range(rng.randint(3, 6))) + " ." for _ in range(4)]
        position = rng.randrange(len(sentences) + 1)
        place = rng.choice(PLACES)
        sentences.insert(position, f"{person} met {rng.choice(PEOPLE)} ." if impossible else f"{person} went to {place} .")
        context = " ".join(sentences)
        qa = {"id": f"q{seed}_{i}", "question": f"where did {person} go", "answers": [], "is_impossible": impossible}
        if not impossible:
            qa["answers"] = [{"text": place, "answer_start": context.index(f"{person} went to {place}") +
                              len(f"{person} went to ")}]
        paragraphs.append({"context": context, "qas": [qa]})
    return {"version": "v2.0", "data": [{"title": "made", "paragraphs": paragraphs}]}


def write_squad(path, n: int, seed: int) -> str:
    import json

    with open(path, "w") as f:
        json.dump(squad_json(n, seed), f)
    return str(path)


def sts_rows(n: int, seed: int) -> list[dict]:
    """Sentence pairs scored by how alike their sentiment is: 1.0 same polarity, 0.0 opposite; a `label` too."""
    rng = random.Random(seed)
    a, b = sentiment_rows(n, seed), sentiment_rows(n, seed + 1)
    rng.shuffle(b)
    return [{"sentence1": x["sentence"], "sentence2": y["sentence"],
             "score": f"{float(x['label'] == y['label']):.1f}",
             "label": "same" if x["label"] == y["label"] else "opposite"} for x, y in zip(a, b)]


def paraphrase_rows(n: int, seed: int) -> list[dict]:
    """Positive pairs for in-batch negatives: two sentences of the same polarity."""
    rows = [r for r in sts_rows(4 * n, seed) if r["score"] == "1.0"]
    return rows[:n]
