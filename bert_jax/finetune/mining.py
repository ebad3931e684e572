"""Training pairs and a retrieval set mined from a corpus without labels: the weakly-supervised contrastive stage
that follows MLM in nomic's contrastors, GTE and E5 (neighbouring passages of one document as positives), and a
BEIR-layout set to judge it (a sentence as the query, the rest of its passage as the document to find).

A document is a list of sentences (data_pipelines' segments); a passage is `sentences` consecutive ones.
Which documents go to the pairs and which to the retrieval set is decided by a hash of the document's index
(data_pipelines.sources.corpus.is_eval_document), so the two never share a document.
"""
import json
from collections.abc import Iterable, Iterator

from data_pipelines.sources.corpus import is_eval_document

from bert_jax.finetune import beir
from bert_jax.storage import paths


def passages(document: list[str], sentences: int) -> list[str]:
    """The document's sentences, `sentences` at a time (a short tail joins the last passage)."""
    out = [" ".join(document[i:i + sentences]) for i in range(0, len(document), sentences)]
    if len(out) > 1 and len(document) % sentences and len(document) % sentences < sentences // 2 + 1:
        out[-2:] = [out[-2] + " " + out[-1]]
    return out


def split(documents: Iterable[list[str]], eval_fraction: float) -> tuple[list[list[str]], list[list[str]]]:
    """(pair documents, retrieval-set documents), by each document's index."""
    train, held_out = [], []
    for i, d in enumerate(documents):
        (held_out if is_eval_document(i, eval_fraction) else train).append(d)
    return train, held_out


def neighbour_pairs(documents: Iterable[list[str]], sentences: int = 3) -> Iterator[dict]:
    """{"sentence1", "sentence2"}: each passage and the one after it in the same document."""
    for document in documents:
        ps = passages(document, sentences)
        for a, b in zip(ps, ps[1:]):
            yield {"sentence1": a, "sentence2": b}


def write_beir(documents: Iterable[list[str]], folder: str, sentences: int = 3, max_queries: int = 0) -> int:
    """A BEIR-layout set in `folder`: every passage is a document; a passage's first sentence (at least 4 words)
    becomes a query whose one relevant document is the rest of that passage. Returns the number of queries."""
    corpus, queries, qrels = [], [], []
    for i, document in enumerate(documents):
        for j, passage in enumerate(passages(document, sentences)):
            doc_id = f"d{i}-{j}"
            first, _, rest = passage.partition(". ")
            if (not max_queries or len(queries) < max_queries) and len(first.split()) >= 4 and rest:
                corpus.append({"_id": doc_id, "title": "", "text": rest})
                queries.append({"_id": f"q{i}-{j}", "text": first})
                qrels.append((f"q{i}-{j}", doc_id, 1))
            else:
                corpus.append({"_id": doc_id, "title": "", "text": passage})
    beir.write(folder, corpus, queries, qrels)
    return len(queries)


def write_sts(documents: list[list[str]], folder: str, seed: int = 0, sentences: int = 3) -> int:
    """A stand-in for STS-B in GLUE's layout (folder/STS-B/{train,dev}.tsv: sentence1, sentence2, score 0–5): each
    neighbour pair scores 5, the same passage beside one of another document 0. It tells a model that learnt the
    corpus's topics from one that did not; for figures to compare with papers, use STS-B itself. Returns the rows."""
    import random  # noqa: PLC0415

    rng = random.Random(seed)
    every = [p for d in documents for p in passages(d, sentences)]
    rows = []
    for pair in neighbour_pairs(documents, sentences):
        rows.append((pair["sentence1"], pair["sentence2"], "5.0"))
        rows.append((pair["sentence1"], rng.choice(every), "0.0"))
    rng.shuffle(rows)
    cut = max(1, len(rows) // 5)
    for split, part in (("dev", rows[:cut]), ("train", rows[cut:])):
        text = "sentence1\tsentence2\tscore\n" + "".join("\t".join(r) + "\n" for r in part)
        paths.write_atomically(paths.path(folder) / "STS-B" / f"{split}.tsv", text)
    # The dev rows as JSONL too: the validation file of a contrastive run on pairs.jsonl (one data.format).
    paths.write_atomically(paths.path(folder) / "STS-B" / "dev.jsonl", "".join(
        json.dumps({"sentence1": a, "sentence2": b, "score": float(s)}) + "\n" for a, b, s in rows[:cut]))
    return len(rows)
