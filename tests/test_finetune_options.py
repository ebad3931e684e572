"""Fine-tuning options do what they promise on a real run: early stopping stops and reports the best step, frozen
layers stay exactly as loaded while the rest learns, and reinit_pooler replaces the source's pooler."""
import json

import jax
import numpy as np
import pytest

import finetune_data as fd
from bert_jax.finetune import init_from
from bert_jax.finetune.hf_export import load_finetuned
from bert_jax.finetune.run import finetune
from test_finetune import micro_config

pytest.importorskip("torch")  # the tiny Hugging Face folder is written by transformers


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("options_inputs")
    return {"hf_dir": fd.write_tiny_hf_bert(str(d / "hf")),
            "train.csv": fd.write_csv(d / "train.csv", fd.sentiment_rows(128, 0)),
            "validation.csv": fd.write_csv(d / "validation.csv", fd.sentiment_rows(64, 5)),
            "test.csv": fd.write_csv(d / "test.csv", fd.sentiment_rows(32, 1))}


def equal_leaves(a, b) -> list[bool]:
    return jax.tree.leaves(jax.tree.map(np.array_equal, a, b))


@pytest.mark.slow  # ~30 s: one run
def test_early_stopping_stops_after_patience_and_results_are_the_metrics_logged_at_the_best_step(inputs, tmp_path):
    """Validation accuracy reaches 1.0 and cannot improve on it: the run stops `patience` validations later, with
    a lower validation loss than at its best step, and reports the best step's params and metrics."""
    c = micro_config("classification", inputs["hf_dir"], inputs)
    c.data.validation = inputs["validation.csv"]
    c.early_stopping.metric, c.early_stopping.patience = "accuracy", 5
    c.train.epochs, c.train.batch_size = 8.0, 16
    c.train.eval_every_steps = 4
    results = finetune(c, str(tmp_path))
    best = json.load(open(tmp_path / "best.json"))
    evals = {row["step"]: {k[len("eval/"):]: v for k, v in row.items() if k.startswith("eval/")}
             for row in map(json.loads, open(tmp_path / "metrics.jsonl")) if "eval/loss" in row}
    last = max(evals)
    print(f"best {best}, stopped at step {last} of {results['num_steps']}; validations {evals}")
    assert best["value"] == 1.0 and last == best["step"] + 4 * c.early_stopping.patience < results["num_steps"]
    assert results["validation"] == evals[best["step"]] != evals[last]
    assert evals[last]["loss"] < evals[best["step"]]["loss"]  # the last params are not what was reported


@pytest.mark.slow  # ~20 s: one run of 8 steps
def test_frozen_layers_stay_bit_identical_and_the_others_learn(inputs, tmp_path):
    """freeze_layers=1 of 2: the embeddings and layer 0 stay as loaded, layer 1, the pooler and the head move."""
    c = micro_config("classification", inputs["hf_dir"], inputs)
    c.train.freeze_layers = 1
    c.train.epochs, c.train.batch_size = 1.0, 16
    finetune(c, str(tmp_path))
    _, params, config, _ = load_finetuned(str(tmp_path))
    source = init_from.resolve(inputs["hf_dir"], config.model).params
    tuned = params["backbone"]["encoder"]
    assert all(equal_leaves(tuned["embeddings"], source["encoder"]["embeddings"]))
    layer = lambda i, tree: jax.tree.map(lambda x: x[i], tree)  # noqa: E731  row i of the scanned stack: layer i
    assert all(equal_leaves(layer(0, tuned["stack"]), layer(0, source["encoder"]["stack"])))
    assert not any(equal_leaves(layer(1, tuned["stack"]), layer(1, source["encoder"]["stack"])))
    assert not any(equal_leaves(params["backbone"]["pooler"], source["pooler"]))


@pytest.mark.slow  # ~10 s: one run of 2 steps
def test_reinit_pooler_replaces_the_sources_pooler_and_keeps_the_rest(inputs, tmp_path):
    """At a learning rate of 0 the params stay as loaded: the source's, but a freshly initialised pooler."""
    c = micro_config("classification", inputs["hf_dir"], inputs)
    c.train.reinit_pooler = True
    c.train.learning_rate = 0.0
    c.train.epochs = 0.5
    finetune(c, str(tmp_path))
    _, params, config, _ = load_finetuned(str(tmp_path))
    source = init_from.resolve(inputs["hf_dir"], config.model).params
    assert all(equal_leaves(params["backbone"]["encoder"], source["encoder"]))
    pooler, loaded = params["backbone"]["pooler"], source["pooler"]
    assert jax.tree.structure(pooler) == jax.tree.structure(loaded)
    # Both biases start at 0 (ours and Hugging Face's init); the kernel is a fresh draw.
    assert not np.array_equal(pooler["kernel"], loaded["kernel"])
    assert np.isfinite(pooler["kernel"]).all() and 0.5 < pooler["kernel"].std() / 0.02 < 2  # initializer_range
