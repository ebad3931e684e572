"""The fine-tuning run: the pre-training machinery (mesh, sharded state, jitted step with donation,
orbax checkpoints with the data iterator, MetricsWriter, the progress line) around a task head.

DIR holds config.json, labels.json, checkpoints/, best/ (the best params by
config.early_stopping.metric), metrics.jsonl, plots/, predictions.jsonl, results.json and
diagnosis.json. A killed run resumes from its newest checkpoint with the same batches.
"""
import json
import math

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from bert_jax.checkpoint import hf_folder
from bert_jax.checkpoint import manager as ckpt
from bert_jax.finetune import data, init_from, losses, metrics, squad
from bert_jax.finetune.cadence import make_cadence
from bert_jax.finetune.model import build_finetune_model
from bert_jax.finetune.optimizer import make_optimizer
from bert_jax.parallel.mesh import batch_sharding, global_batch, logical_axis_rules, make_mesh
from bert_jax.storage import paths
from bert_jax.train.loop import headline, host_metrics, nonfinite_steps
from bert_jax.train.metrics_writer import MetricsWriter
from bert_jax.train.state import abstract_state_and_shardings, create_sharded_state, make_init_fn
from bert_jax.train.step import make_train_step
from data_pipelines import tokenizer as tokenizer_lib

LOWER_IS_BETTER = ("loss",)


def _labels(config, splits, workdir) -> list[str]:
    """The label names; a resume whose data gives another label count than its checkpoint's head fails."""
    if not has_labels(config.task):
        return []
    names = data.label_names(config.task, splits)
    saved = paths.path(workdir) / "labels.json"
    if saved.exists():
        before = json.loads(saved.read_text())
        if len(before) != len(names):
            raise ValueError(f"the checkpoint in {workdir} has a head of {len(before)} labels {before}, but the "
                             f"data gives {len(names)} labels {names}; use a fresh --workdir")
    elif jax.process_index() == 0:
        paths.write_atomically(saved, json.dumps(names))
    return names


def has_labels(task_cfg) -> bool:
    """Whether the task has named classes (labels.json, id2label)."""
    if task_cfg.kind == "sentence_embedding":
        return task_cfg.embedding_loss == "softmax"
    return task_cfg.kind in ("classification", "token_classification")


def predict_outputs(predict, params, batches, sharding) -> dict:
    """The model's outputs over batches, concatenated: {"logits": [n, ...], ...} (padding rows included)."""
    outs = [jax.device_get(predict(params, global_batch(b, sharding))) for b in batches]
    return {k: np.concatenate([np.asarray(o[k]) for o in outs]) for k in outs[0]}


def evaluate(config, outputs: dict, features: dict, names: list[str], rows: list[dict]) -> dict:
    """Loss and the task's metrics for one split's outputs (padding rows dropped)."""
    n = len(features["input_ids"])
    logits = outputs["logits"][:n]
    if config.task.kind == "sentence_embedding":
        return _evaluate_embeddings(outputs["u"][:n], outputs["v"][:n], features["scores"])
    labels, weights = features["labels"], features["label_weights"]
    kind = config.task.kind
    if kind == "regression":
        predicted = logits[:, 0]
        out = {"loss": float(np.mean((predicted - labels) ** 2))}
        out.update(metrics.regression_metrics(predicted, labels))
        return out
    if kind == "span_qa":
        log_probs = np.asarray(jax.nn.log_softmax(logits, 1))  # over positions
        nll = -(np.take_along_axis(log_probs[..., 0], labels[:, :1], 1) +
                np.take_along_axis(log_probs[..., 1], labels[:, 1:], 1))[:, 0] / 2
        out = {"loss": float(nll.mean())}
        answers = squad.best_answers(logits[..., 0], logits[..., 1], features, rows, config.task.max_answer_length)
        out.update(squad.squad_metrics(answers, rows))
        return out
    log_probs = np.asarray(jax.nn.log_softmax(logits, -1))
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    out = {"loss": float((nll * weights).sum() / max(weights.sum(), 1e-9))}
    predicted = logits.argmax(-1)
    if kind == "classification":
        out.update(metrics.classification_metrics(predicted, labels, len(names)))
        return out
    pred_tags, gold_tags = word_tags(predicted, features, names), word_tags(labels, features, names)
    if config.task.tagging == "pos":
        out.update(metrics.token_accuracy(pred_tags, gold_tags))
    else:
        out.update(metrics.entity_metrics(pred_tags, gold_tags))
        out.update(metrics.token_accuracy(pred_tags, gold_tags))
    return out


def _evaluate_embeddings(u: np.ndarray, v: np.ndarray, scores: np.ndarray) -> dict:
    """Spearman of cos(u, v) with the gold scores (SBERT's STS evaluation), and the in-batch-negatives ranking
    loss over the whole split as its loss (every other pair a negative)."""
    un = u / np.maximum(np.linalg.norm(u, axis=-1, keepdims=True), 1e-9)
    vn = v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-9)
    similarity = (un * vn).sum(-1)
    logits = 20.0 * un @ vn.T
    log_probs = np.asarray(jax.nn.log_softmax(logits, -1))
    out = {"loss": float(-np.mean(np.diag(log_probs)))}
    out.update(metrics.regression_metrics(similarity, scores))
    return out


def word_tags(piece_labels: np.ndarray, features: dict, names: list[str]) -> list[list[str]]:
    """Per sentence, the tag at each (kept) word's first word-piece."""
    out = []
    for row, positions in zip(piece_labels, features["word_positions"]):
        out.append([names[row[p]] for p in positions if p >= 0])
    return out


def headline_metric(kind: str, tagging: str) -> str:
    return {"classification": "accuracy", "regression": "spearman", "span_qa": "f1", "sentence_embedding": "spearman",
            "token_classification": "token_accuracy" if tagging == "pos" else "entity_f1"}[kind]


def packed_rows_multiple(config, mesh) -> int:
    """What packed batches round their row count to (0: batches stay padded, one row per example).

    config.data.pack_rows_multiple, times what the mesh splits the batch over, so every
    device gets whole rows. Span QA does not pack: its windows fill max_seq_length by design,
    and its loss reads the logits of every position of a window, padding included, as
    Hugging Face's does.
    """
    if not config.data.packing:
        return 0
    if config.task.kind == "span_qa":
        raise ValueError("config.data.packing=True, but span_qa windows already fill config.data.max_seq_length; "
                         "set --config.data.packing=False")
    if config.data.pack_rows_multiple < 1:
        raise ValueError(f"config.data.pack_rows_multiple={config.data.pack_rows_multiple} must be >= 1")
    return math.lcm(int(config.data.pack_rows_multiple), mesh.shape["data"] * mesh.shape["fsdp"])


def run(config, workdir: str, stop_at_step: int | None = None) -> dict:
    """Fine-tunes one seed in `workdir` (resuming from its checkpoints); returns results.json's content."""
    t_cfg = config.train
    root = paths.path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    source = init_from.resolve(config.init_from, config.model)
    tokenizer_dir = str(root / "tokenizer")
    if jax.process_index() == 0 and not tokenizer_lib.has_tokenizer(tokenizer_dir):
        hf_folder.copy_tokenizer_files(source.tokenizer_dir, tokenizer_dir)
        if not tokenizer_lib.has_tokenizer(tokenizer_dir):
            raise ValueError(f"config.init_from={config.init_from!r} has no tokenizer to fine-tune with")
    tokenizer = tokenizer_lib.load_tokenizer(tokenizer_dir)
    fast = data.fast_tokenizer(tokenizer, config.data.max_seq_length)
    splits = data.read_splits(config.data, config.task)
    names = _labels(config, splits, workdir)
    if config.task.kind == "span_qa":
        features = {name: squad.featurize(fast, split.rows, config.data.doc_stride) for name, split in splits.items()}
    else:
        features = {name: data.featurize(config.task, fast, split.rows, names) for name, split in splits.items()}
    if jax.process_index() == 0:
        resolved = json.loads(config.to_json_best_effort())
        resolved["model"] = source.model_cfg.to_dict()
        paths.write_atomically(root / "config.json", json.dumps(resolved, indent=2, sort_keys=True))

    n_train = len(features["train"]["input_ids"])
    batch_size = t_cfg.batch_size
    epochs = math.ceil(t_cfg.epochs)
    num_steps = max(1, math.ceil(t_cfg.epochs * n_train / batch_size))
    steps_per_epoch = max(1, math.ceil(n_train / batch_size))
    cadence = make_cadence(t_cfg, config.checkpoint, num_steps, steps_per_epoch)
    last_step = num_steps if stop_at_step is None else min(stop_at_step, num_steps)

    kind = config.task.kind
    num_outputs = {"regression": 1, "span_qa": 2}.get(kind, max(len(names), 1))
    has_pooler = "pooler" in source.params
    model = build_finetune_model(source.family, source.model_cfg, config.task, num_outputs, has_pooler)
    objective = losses.objective_for(config.task)
    tx, schedule = make_optimizer(t_cfg, num_steps, source.model_cfg.num_layers)
    mesh = make_mesh(config.mesh)
    rules = logical_axis_rules(config.mesh)
    example = {k: v[:1] for k, v in data.eval_batches(features["train"], 1)[0].items()}
    init = make_init_fn(model, tx, None, config.seed, example=example)
    abstract_state, shardings = abstract_state_and_shardings(init, mesh, rules)
    data_sharding = batch_sharding(mesh, rules)
    train_step = jax.jit(make_train_step(model, objective, tx, t_cfg.grad_accum_steps),
                         in_shardings=(shardings, data_sharding), out_shardings=(shardings, None), donate_argnums=0)
    predict = jax.jit(lambda params, batch: model.apply({"params": params}, batch, deterministic=True),
                      in_shardings=(shardings.params, data_sharding))

    rows_multiple = packed_rows_multiple(config, mesh)
    min_rows = data.typical_rows(features["train"], batch_size, rows_multiple) if rows_multiple else 0
    train_iter = data.train_iterator(features["train"], batch_size, epochs, config.seed, rows_multiple, min_rows)
    manager = ckpt.make_manager(paths.absolute(root / "checkpoints"), config.checkpoint)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        state = ckpt.restore_latest(manager, abstract_state, train_iter)
        if state is None:
            state = create_sharded_state(init, shardings)
            state = state.replace(params=jax.device_put(_pretrained(state.params, source, config), shardings.params))
    start = int(state.step)
    logging.info("fine-tuning %s from %s (%s, family %s): %d train / %d validation examples, %d labels, "
                 "%d steps (%d per epoch), starting at step %d", kind, config.init_from, source.kind,
                 source.family.name, n_train, len(features["validation"]["input_ids"]), len(names), num_steps,
                 steps_per_epoch, start)

    es = config.early_stopping
    best_metric = es.metric
    best = _read_best(root)
    writer = MetricsWriter(workdir, config, start if start else -1)  # a fresh start re-runs step 0's evaluation
    eval_sets = {name: data.eval_batches(f, batch_size, rows_multiple, min_rows) for name, f in features.items()}
    stale = best.get("stale", 0)
    stopped_early = False
    last_eval = {}

    def validate(step: int) -> dict:
        """Scores the current params on the validation split; writes and logs them."""
        outputs = predict_outputs(predict, state.params, eval_sets["validation"], data_sharding)
        scores = evaluate(config, outputs, features["validation"], names, splits["validation"].rows)
        last_eval.update(step=step, scores=scores)
        writer.write(step, {f"eval/{k}": v for k, v in scores.items()})
        logging.info("eval step %d%s | %s", step, " (before training)" if step == 0 else "",
                     " | ".join(f"{k} {v:.4f}" for k, v in scores.items() if "/" not in k))
        return scores

    try:
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
            pending = []
            if start == 0 and cadence.validates_at(0):  # the untrained model: where the learning curves start
                validate(0)
            for step in range(start + 1, last_step + 1):
                state, m = train_step(state, global_batch(next(train_iter), data_sharding))
                pending.append((step, m))
                is_last = step == last_step
                if step % cadence.log_every == 0 or is_last:
                    row = host_metrics(pending, t_cfg.nan_policy)
                    pending = []
                    row["train/learning_rate"] = float(schedule(step - 1))
                    row["train/epoch"] = step / steps_per_epoch
                    writer.write(step, row)
                    logging.info("step %d/%d | epoch %.2f | %s", step, num_steps, step / steps_per_epoch,
                                 headline(row, "train", objective))
                if cadence.validates_at(step):
                    scores = validate(step)
                    if best_metric:
                        if best_metric not in scores:
                            raise ValueError(f"config.early_stopping.metric={best_metric!r}; the validation "
                                             f"metrics are {sorted(scores)}")
                        sign = -1 if best_metric in LOWER_IS_BETTER else 1
                        if "value" not in best or sign * scores[best_metric] > sign * best["value"]:
                            best = {"step": step, "value": scores[best_metric], "stale": 0}
                            _save_best(root, state.params)
                            stale = 0
                        else:
                            stale += 1
                        best["stale"] = stale
                        if jax.process_index() == 0:
                            paths.write_atomically(root / "best.json", json.dumps(best))
                        if es.patience and stale >= es.patience:
                            logging.info("early stopping at step %d: %s has not improved for %d evaluations "
                                         "(best %.4f at step %d)", step, best_metric, stale, best["value"],
                                         best["step"])
                            stopped_early = True
                if step % cadence.save_every == 0 or is_last or stopped_early:
                    nonfinite_steps(pending, t_cfg.nan_policy)
                    ckpt.save(manager, step, state, train_iter)
                    # Drawn with each checkpoint (once an epoch), not at every validation: rendering is host time
                    # the device waits on.
                    writer.plot(("loss", headline_metric(kind, config.task.tagging)))
                if stopped_early:
                    break
    finally:
        try:
            ckpt.wait_until_finished(manager)
        finally:
            manager.close()
            writer.close()
    if stop_at_step is not None and last_step < num_steps and not stopped_early:
        return {"stopped_at": last_step}

    params = state.params
    if best_metric and "step" in best:
        params = _restore_best(root, abstract_state.params)
        logging.info("using the best params: %s %.4f at step %d", best_metric, best["value"], best["step"])
        last_eval.clear()
    if last_eval.get("step") == int(state.step):  # the final params were just validated
        validation = last_eval["scores"]
    else:
        validation = evaluate(config, predict_outputs(predict, params, eval_sets["validation"], data_sharding),
                              features["validation"], names, splits["validation"].rows)
    results = {"validation": validation, "num_steps": num_steps, "labels": names}
    if "test" in features:
        outputs = predict_outputs(predict, params, eval_sets["test"], data_sharding)
        results["test"] = evaluate(config, outputs, features["test"], names, splits["test"].rows)
        _write_predictions(root, config, outputs, features["test"], splits["test"].rows, names)
    results["diagnosis"] = _diagnose(config, workdir, kind)
    if jax.process_index() == 0:
        paths.write_atomically(root / "results.json", json.dumps(results, indent=2))
    logging.info("validation: %s", " | ".join(f"{k} {v:.4f}" for k, v in results["validation"].items()
                                              if "/" not in k))
    return results


def _pretrained(fresh_params, source, config) -> dict:
    """The fresh task model's params with the backbone from the source (and, if asked, a fresh pooler)."""
    fresh = jax.device_get(fresh_params)
    backbone = init_from.backbone_subset(source.params, fresh["backbone"])
    if config.train.reinit_pooler and "pooler" in backbone:
        backbone["pooler"] = fresh["backbone"]["pooler"]
    return {**fresh, "backbone": backbone}


def _read_best(root) -> dict:
    path = root / "best.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _save_best(root, params) -> None:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(paths.absolute(root / "best" / "params"), params, force=True)
    checkpointer.wait_until_finished()


def _restore_best(root, abstract_params):
    return ocp.StandardCheckpointer().restore(paths.absolute(root / "best" / "params"), abstract_params)


def _write_predictions(root, config, outputs, features, rows, names) -> None:
    lines, logits = [], outputs["logits"]
    n = len(rows)
    for i in range(n):
        if config.task.kind == "sentence_embedding":
            u, v = outputs["u"][i], outputs["v"][i]
            lines.append({"index": i, "cosine": float(u @ v / max(np.linalg.norm(u) * np.linalg.norm(v), 1e-9))})
        elif config.task.kind == "regression":
            lines.append({"index": i, "prediction": float(logits[i, 0])})
        elif config.task.kind == "span_qa":
            if i == 0:
                answers = squad.best_answers(logits[..., 0], logits[..., 1], features, rows,
                                             config.task.max_answer_length)
            lines.append({"id": rows[i]["id"], "answer": answers[i]})
        elif config.task.kind == "classification":
            probs = np.asarray(jax.nn.softmax(logits[i]))
            lines.append({"index": i, "label": names[int(probs.argmax())],
                          "probabilities": {name: float(p) for name, p in zip(names, probs)}})
        else:
            tags = word_tags(logits[i:i + 1].argmax(-1), {"word_positions": features["word_positions"][i:i + 1]},
                             names)[0]
            lines.append({"index": i, "words": rows[i]["words"][:len(tags)], "tags": tags})
    if jax.process_index() == 0:
        paths.write_atomically(root / "predictions.jsonl", "".join(json.dumps(line) + "\n" for line in lines))


def _diagnose(config, workdir: str, kind: str) -> dict:
    """The learning-curve diagnosis (bert_jax/finetune/diagnosis.py), printed and written to DIR."""
    from bert_jax.finetune import diagnosis
    from bert_jax.train.metrics_file import read_rows

    rows = read_rows(paths.path(workdir) / "metrics.jsonl")
    metric = headline_metric(kind, config.task.tagging)
    curves = diagnosis.Curves(
        train_loss=[(r["step"], r["train/loss"]) for r in rows if "train/loss" in r],
        val_loss=[(r["step"], r["eval/loss"]) for r in rows if "eval/loss" in r],
        val_metric=[(r["step"], r[f"eval/{metric}"]) for r in rows if f"eval/{metric}" in r],
        metric_name=metric, higher_is_better=True)
    thresholds = diagnosis.default_config()
    thresholds.update(config.get("diagnosis") or {})
    result = diagnosis.diagnose(curves, thresholds)
    if jax.process_index() == 0:
        diagnosis.write(workdir, curves, result)
    logging.info("diagnosis: %s — %s", result.name, result.advice)
    print(f"diagnosis: {result.name} — {result.advice}")
    return {"name": result.name, "advice": result.advice}


def finetune(config, workdir: str, stop_at_step: int | None = None) -> dict:
    """One run, or (config.seeds = "0,1,2") one per seed in DIR/seed_<s> and their mean ± std."""
    seeds = [int(s) for s in str(config.seeds).split(",") if s.strip()]
    if not seeds:
        return run(config, workdir, stop_at_step)
    per_seed = {}
    for seed in seeds:
        c = config.copy_and_resolve_references()
        c.seed, c.seeds = seed, ""
        per_seed[seed] = run(c, str(paths.path(workdir) / f"seed_{seed}"), stop_at_step)
    if any("validation" not in r for r in per_seed.values()):
        return {"seeds": per_seed}
    summary = {}
    for split in ("validation", "test"):
        keys = [k for k in per_seed[seeds[0]].get(split, {}) if "/" not in k]
        for k in keys:
            values = np.array([per_seed[s][split][k] for s in seeds])
            summary[f"{split}/{k}"] = {"mean": float(values.mean()), "std": float(values.std(ddof=1))
                                       if len(values) > 1 else 0.0, "values": values.tolist()}
    for key, s in summary.items():
        logging.info("%s over seeds %s: %.4f ± %.4f", key, seeds, s["mean"], s["std"])
        print(f"{key} over seeds {seeds}: {s['mean']:.4f} ± {s['std']:.4f}")
    if jax.process_index() == 0:
        paths.write_atomically(paths.path(workdir) / "seeds.json", json.dumps(summary, indent=2))
    return {"seeds": per_seed, "summary": summary}
