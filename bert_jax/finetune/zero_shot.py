"""The zero-shot part of a battery: retrieval over BEIR-layout datasets with the checkpoint as it is.

A suite's `retrieval` section (configs/suites/recipe.py's `retrieval()`) asks for it; its datasets are the
subfolders of --beir_dir (the task name is the subfolder's), or those --tasks names. Nothing is trained, so
there are no seeds: each dataset is one run, its nDCG@10 the scoreboard's median.

    OUT/retrieval/datasets.json          what was asked: the checkpoint, --beir_dir, the datasets, how to embed
    OUT/retrieval/<name>/results.json    ndcg@10, recall@100, mrr@10, sizes, encode and search seconds
    OUT/retrieval/<name>/run.trec        each query's 100 best documents (TREC's run format)

Every dataset and the checkpoint are checked before anything is written; a rerun keeps the datasets that
have results.json.
"""
import dataclasses
import json

import jax

from bert_jax import UserError
from bert_jax.finetune import beir, init_from, retrieval
from bert_jax.parallel.mesh import logical_axis_rules, make_mesh
from bert_jax.run.refusal import refusal
from bert_jax.storage import paths
from data_pipelines.tokenizers import tokenizer as tokenizer_lib


@dataclasses.dataclass
class Plan:
    """What a battery's zero-shot part will do, every input checked."""
    datasets: list[beir.Dataset]
    source: init_from.Source | None
    settings: retrieval.Settings | None
    beir_dir: str


def names(suite, beir_dir: str) -> list[str]:
    """The datasets of the suite's retrieval section: --beir_dir's subfolders ([] when the suite has none)."""
    if "retrieval" not in suite:
        return []
    if not beir_dir:
        raise UserError(f"suite {suite.name!r} has retrieval datasets: give --beir_dir (BEIR's layout, a dataset per "
                        f"subfolder)")
    return beir.dataset_names(beir_dir)


def prepare(checkpoint: str, suite, beir_dir: str, datasets: list[str]) -> Plan:
    """Reads and checks every dataset, then the checkpoint: raises UserError naming the file and row, or the flag,
    before anything is written."""
    if not datasets:
        return Plan([], None, None, beir_dir)
    checked = [beir.read(beir_dir, n) for n in datasets]
    spec = suite.retrieval
    try:
        source = init_from.resolve(checkpoint, spec.finetune.model, key="--checkpoint")
        how = retrieval.settings(spec, source)
    except ValueError as e:
        if refusal(e) is None:  # a fault reading the checkpoint keeps its traceback
            raise
        raise UserError(f"--checkpoint={checkpoint}: {e}") from None
    return Plan(checked, source, how, beir_dir)


def _record(checkpoint: str, plan: Plan) -> dict:
    return {"checkpoint": checkpoint, "beir_dir": plan.beir_dir, "datasets": [d.name for d in plan.datasets],
            "settings": dataclasses.asdict(plan.settings)}


def run(checkpoint: str, suite, out: str, plan: Plan) -> dict[str, dict]:
    """Each dataset's results.json content (computing those not yet in OUT)."""
    if not plan.datasets:
        return {}
    root = paths.path(out) / "retrieval"
    record = _record(checkpoint, plan)
    before = root / "datasets.json"
    if before.exists():
        old = json.loads(before.read_text())
        changed = [k for k in ("checkpoint", "settings") if old.get(k) != record[k]]
        if changed:
            raise UserError(f"{out} holds retrieval results of another {', '.join(changed)} ({before}); use a fresh "
                            f"--out")
    if jax.process_index() == 0:
        paths.write_atomically(before, json.dumps({**record, "datasets": sorted(set(record["datasets"]) | set(
            json.loads(before.read_text())["datasets"] if before.exists() else []))}, indent=2))
    spec = suite.retrieval
    mesh = make_mesh(spec.finetune.mesh)
    rules = logical_axis_rules(spec.finetune.mesh)
    encode = None
    results = {}
    for dataset in plan.datasets:
        done = root / dataset.name / "results.json"
        if done.exists():
            results[dataset.name] = json.loads(done.read_text())
            continue
        if encode is None:
            tokenizer = tokenizer_lib.load_tokenizer(plan.source.tokenizer_dir)
            encode = retrieval.make_encoder(plan.source, plan.settings, tokenizer, spec.batch_size, mesh, rules)
        print(f"[evaluate] retrieval {dataset.name}: {len(dataset.queries)} queries, {dataset.num_documents} "
              f"documents", flush=True)
        metrics, run_text = retrieval.evaluate(dataset, encode, plan.settings, mesh, spec.chunk_size)
        if jax.process_index() == 0:
            paths.write_atomically(root / dataset.name / "run.trec", run_text)
            paths.write_atomically(done, json.dumps(metrics, indent=2))  # last: the dataset is done
        results[dataset.name] = metrics
    return results


def board_rows(results: dict[str, dict]) -> dict[str, dict]:
    """Scoreboard rows: nDCG@10 as the median of one zero-shot run (no seeds), the other metrics beside it."""
    rows = {}
    for name, r in results.items():
        value = r[retrieval.HEADLINE]
        rows[name] = {"metric": retrieval.HEADLINE, "median": value, "min": value, "max": value, "n": 1,
                      "best_lr": None, "learning_rate": None, "scores": {}, "median_by_lr": {}, "zero_shot": True,
                      "kind": "retrieval", "chance": None, "chance_margin": None, "at_chance": None,
                      "recall@100": r["recall@100"], "mrr@10": r["mrr@10"]}
    return rows
