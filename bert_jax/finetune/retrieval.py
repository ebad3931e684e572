"""Zero-shot dense retrieval, as the encoder papers of 2024–26 report it: embed a BEIR dataset's queries and
corpus with the checkpoint, search exactly, score nDCG@10, Recall@100 and MRR@10.

Embeddings are the checkpoint's pooling of its last hidden states (mean or [CLS]: a sentence-transformers
folder's 1_Pooling, a fine-tuned sentence-embedding run's config.task.pooling, else mean; the suite may
set one), unit length, so the score is the cosine. A document is its title and text joined by a space, as
BEIR's SentenceBERT wrapper does; query and document prefixes ("search_query: ") come from the suite or the
folder's sentence-transformers prompts.

Exact search streams the corpus a chunk at a time (beir.Dataset.documents): each chunk's embeddings are
sharded over every device of the mesh, each device scores its shard against all queries and keeps its
top-k, the shards' top-k are gathered and merged, and the chunk's top-k is merged on the host with the
best so far. Memory holds the queries, one chunk and k results per query, whatever the corpus's size.
The metrics are pytrec_eval's (trec_eval's code), not ours: `ndcg_cut_10`, `recall_100`, and
`recip_rank` on each query's first 10 results.
"""
import dataclasses
import json
import math
import time
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax.finetune import data, init_from
from bert_jax.finetune.beir import Dataset
from bert_jax.finetune.model import POOLINGS, pool
from bert_jax.parallel.mesh import batch_sharding, global_batch, host_share, logical_shardings
from bert_jax.storage import paths

HEADLINE = "ndcg@10"
TOP_K = 100  # results kept per query: what Recall@100 reads
LENGTH_BUCKET = 32  # texts are padded to a multiple of this, so a dataset compiles a few shapes


@dataclasses.dataclass(frozen=True)
class Settings:
    """How a checkpoint embeds text for retrieval."""
    pooling: str
    max_seq_length: int
    query_prefix: str
    document_prefix: str


def _json(path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def settings(spec, source: init_from.Source) -> Settings:
    """The checkpoint's own way to embed (see the module's docstring), with what the suite's `retrieval` section
    sets (a non-empty pooling or prefix, a non-zero max_seq_length) taking precedence."""
    pooling, length, prompts = "mean", 0, {}
    root = paths.path(source.path)
    run = _json(root / "config.json")  # a fine-tuned workdir's config holds its task; an HF folder's does not
    if (root / "modules.json").exists():  # a sentence-transformers folder
        for module in json.loads((root / "modules.json").read_text()):
            if module["type"].endswith("Pooling"):
                p = _json(root / module["path"] / "config.json")
                pooling = "cls" if p.get("pooling_mode_cls_token") else "mean"
        length = int(_json(root / "sentence_bert_config.json").get("max_seq_length", 0))
        prompts = _json(root / "config_sentence_transformers.json").get("prompts") or {}
    elif "pooling" in run.get("task", {}):  # a fine-tuned sentence-embedding run
        pooling, length = run["task"]["pooling"], int(run["data"]["max_seq_length"])
    if spec.pooling:
        pooling = spec.pooling
    if pooling not in POOLINGS:
        raise ValueError(f"retrieval.pooling={pooling!r}; expected one of {POOLINGS}")
    length = spec.max_seq_length or length or 512
    length = min(length, int(source.model_cfg.get("max_position_embeddings", length)))
    query = spec.query_prefix or prompts.get("query", "")
    document = spec.document_prefix or prompts.get("document", prompts.get("passage", ""))
    return Settings(pooling, length, query, document)


def make_encoder(source: init_from.Source, how: Settings, tokenizer, batch_size: int, mesh,
                 rules) -> Callable[[list[str]], np.ndarray]:
    """texts -> [n, hidden] float32 unit vectors, on every host: the source's encoder over the mesh (batches
    split as the `batch` axis says, params as their logical names say), longest texts first."""
    model = source.family.build_model(source.model_cfg)
    fast = data.fast_tokenizer(tokenizer, how.max_seq_length)
    fast.no_padding()
    example = {k: np.ones((1, LENGTH_BUCKET), np.int32) for k in ("input_ids", "attention_mask", "token_type_ids")}
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), example, True, method="encode"))["params"]
    shardings = logical_shardings(boxed, mesh, rules)
    params = init_from.backbone_subset(source.params, nn.meta.unbox(boxed))
    params = jax.device_put(params, shardings)
    sharding = batch_sharding(mesh, rules)
    batch_size = math.lcm(batch_size, mesh.shape["data"] * mesh.shape["fsdp"], jax.process_count())

    def embed(params, batch):
        vectors = pool(model.apply({"params": params}, batch, True, method="encode"), batch["attention_mask"],
                       how.pooling).astype(jnp.float32)
        return vectors / jnp.maximum(jnp.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)

    embed = jax.jit(embed, in_shardings=(shardings, sharding))
    pad_id = fast.token_to_id(tokenizer.specials.pad) or 0

    def encode(texts: list[str]) -> np.ndarray:
        encodings = fast.encode_batch(texts)
        order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
        out = np.zeros((len(texts), source.model_cfg.hidden_size), np.float32)
        for start in range(0, len(texts), batch_size):
            rows = order[start:start + batch_size]
            length = -(-max(len(encodings[i].ids) for i in rows) // LENGTH_BUCKET) * LENGTH_BUCKET
            batch = {k: np.zeros((batch_size, min(length, how.max_seq_length)), np.int32)
                     for k in ("input_ids", "attention_mask", "token_type_ids")}
            batch["input_ids"][:] = pad_id
            batch["attention_mask"][:, 0] = 1  # padding rows: one real token, so attention is defined
            for r, i in enumerate(rows):
                e, n = encodings[i], len(encodings[i].ids)
                batch["input_ids"][r, :n], batch["token_type_ids"][r, :n] = e.ids, e.type_ids
                batch["attention_mask"][r, :n] = 1
            with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
                vectors = embed(params, global_batch(host_share(batch, jax.process_index(), jax.process_count()),
                                                     sharding))
            out[rows] = np.asarray(multihost_utils.process_allgather(vectors, tiled=True))[:len(rows)]
        return out

    return encode


def make_search(mesh, k: int):
    """(queries [q, hidden] on every host, chunk [c, hidden] numpy on every host, c real rows) -> (scores, rows)
    [q, min(k, c)]: the chunk sharded over every device of the mesh, a top-k per shard, the shards' merged."""
    axes = tuple(mesh.axis_names)
    chunk_sharding = NamedSharding(mesh, PartitionSpec(axes, None))
    replicated = NamedSharding(mesh, PartitionSpec())

    def shard_top_k(queries, chunk, n_valid):
        rows = jax.lax.axis_index(axes) * chunk.shape[0] + jnp.arange(chunk.shape[0])
        scores = jnp.einsum("qh,ch->qc", queries, chunk, precision=jax.lax.Precision.HIGHEST)
        scores = jnp.where(rows[None] < n_valid, scores, -jnp.inf)
        scores, best = jax.lax.top_k(scores, min(k, chunk.shape[0]))
        scores = jax.lax.all_gather(scores, axes, axis=1, tiled=True)
        best = jax.lax.all_gather(rows[best], axes, axis=1, tiled=True)
        scores, merged = jax.lax.top_k(scores, min(k, scores.shape[1]))
        return scores, jnp.take_along_axis(best, merged, 1)

    search = jax.jit(jax.shard_map(shard_top_k, mesh=mesh, in_specs=(PartitionSpec(), PartitionSpec(axes, None),
                                                                     PartitionSpec()),
                                   out_specs=(PartitionSpec(), PartitionSpec()),
                                   check_vma=False))  # all_gather's results are the same on every device

    def run(queries: np.ndarray, chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = len(chunk)
        padded = np.zeros((-(-n // mesh.size) * mesh.size, chunk.shape[1]), np.float32)
        padded[:n] = chunk
        to_device = lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i])  # noqa: E731
        with jax.set_mesh(mesh):
            scores, rows = search(to_device(queries, replicated), to_device(padded, chunk_sharding),
                                  to_device(np.int32(n), replicated))
        scores, rows = np.asarray(scores.addressable_data(0)), np.asarray(rows.addressable_data(0))  # replicated
        keep = min(k, n)
        return scores[:, :keep], rows[:, :keep]

    return run


def search(dataset: Dataset, encode, how: Settings, mesh, chunk_size: int, k: int = TOP_K) -> tuple[dict, dict]:
    """({query id: {corpus id: score}} of each query's k best documents, {"encode_s", "search_s"})."""
    query_ids = list(dataset.queries)
    start = time.perf_counter()
    queries = encode([how.query_prefix + dataset.queries[q] for q in query_ids])
    seconds = {"encode_s": time.perf_counter() - start, "search_s": 0.0}
    top = make_search(mesh, k)
    best_scores = np.zeros((len(query_ids), 0), np.float32)
    best_ids = np.zeros((len(query_ids), 0), object)
    for ids, docs in dataset.documents(chunk_size):
        start = time.perf_counter()
        chunk = encode([how.document_prefix + (d.get("title", "") + " " + d["text"]).strip() for d in docs])
        middle = time.perf_counter()
        scores, rows = top(queries, chunk)
        scores = np.concatenate([best_scores, scores], 1)
        names = np.concatenate([best_ids, np.asarray(ids, object)[rows]], 1)
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        best_scores, best_ids = np.take_along_axis(scores, order, 1), np.take_along_axis(names, order, 1)
        seconds["encode_s"] += middle - start
        seconds["search_s"] += time.perf_counter() - middle
    results = {q: {str(d): float(s) for d, s in zip(best_ids[i], best_scores[i]) if np.isfinite(s)}
               for i, q in enumerate(query_ids)}
    return results, seconds


def score(qrels: dict[str, dict[str, int]], results: dict[str, dict[str, float]]) -> dict[str, float]:
    """nDCG@10, Recall@100 and MRR@10, each the mean over the queries, by pytrec_eval."""
    import pytrec_eval  # noqa: PLC0415 (only retrieval needs it)

    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(results)
    first_10 = {q: dict(sorted(docs.items(), key=lambda kv: -kv[1])[:10]) for q, docs in results.items()}
    reciprocal = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(first_10)
    mean = lambda table, key: float(np.mean([v[key] for v in table.values()]))  # noqa: E731
    return {"ndcg@10": mean(per_query, "ndcg_cut_10"), "recall@100": mean(per_query, "recall_100"),
            "mrr@10": mean(reciprocal, "recip_rank")}


def trec_run(results: dict[str, dict[str, float]], tag: str) -> str:
    """The results in TREC's run format (qid Q0 docid rank score tag), which trec_eval and ranx read."""
    lines = []
    for q, docs in results.items():
        for rank, (d, s) in enumerate(sorted(docs.items(), key=lambda kv: -kv[1]), start=1):
            lines.append(f"{q} Q0 {d} {rank} {s:.6f} {tag}\n")
    return "".join(lines)


def evaluate(dataset: Dataset, encode, how: Settings, mesh, chunk_size: int) -> dict:
    """One dataset: its metrics, sizes and timings (results.json's content) and its run (TREC format)."""
    results, seconds = search(dataset, encode, how, mesh, chunk_size)
    metrics = score(dataset.qrels, results)
    return {**metrics, "queries": len(dataset.queries), "documents": dataset.num_documents, **seconds,
            "pooling": how.pooling, "max_seq_length": how.max_seq_length}, trec_run(results, "bert_jax")
