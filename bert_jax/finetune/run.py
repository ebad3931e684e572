"""The fine-tuning run: the task of `config.task.kind` (bert_jax/finetune/tasks/) on a family's encoder, handed
to the harness of every run (bert_jax/run/harness.py) as pre-training is.

DIR holds config.json, labels.json, tokenizer/, checkpoints/, best/ (the best params by
config.early_stopping.metric), best.json, metrics.jsonl, plots/, predictions.jsonl,
results.json and diagnosis.json. A killed or preempted run resumes from its newest checkpoint
with the same batches; on several hosts each feeds its share of every batch.
"""
import dataclasses
import json
import math
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.hf import folder as hf_folder
from bert_jax.objectives.objective import Objective
from bert_jax.finetune import config_validation, data, diagnosis, init_from
from bert_jax.finetune import parametrization as finetune_mup
from bert_jax.finetune.cadence import make_cadence
from bert_jax.finetune.optimizer import make_optimizer
from bert_jax.finetune.splits import label_names, read_splits
from bert_jax.finetune.tasks import get_task
from bert_jax.parallel.mesh import batch_sharding, global_batch, logical_axis_rules, make_mesh
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.run import completion, harness
from bert_jax.run.metrics_file import read_rows
from bert_jax.train.state import abstract_state_and_shardings, create_sharded_state, make_init_fn
from bert_jax.models.targets import building_for
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

LOWER_IS_BETTER = ("loss",)


def _labels(config, splits, workdir) -> list[str]:
    """The label names; a resume whose data gives another label count than its checkpoint's head fails."""
    names = label_names(config.task, splits)
    if not names:
        return []
    saved = Workdir(workdir).labels_json
    if saved.exists():
        before = json.loads(saved.read_text())
        if len(before) != len(names):
            raise ValueError(f"the checkpoint in {workdir} has a head of {len(before)} labels {before}, but the "
                             f"data gives {len(names)} labels {names}; use a fresh --workdir")
    elif jax.process_index() == 0:
        paths.write_atomically(saved, json.dumps(names))
    return names


def predict_outputs(predict, params, batches, sharding, n: int) -> dict:
    """The model's outputs over batches, concatenated and gathered on every host: {"logits": [n, ...], ...}
    (padding rows dropped)."""
    outs = [multihost_utils.process_allgather(predict(params, global_batch(b, sharding)), tiled=True)
            for b in batches]
    return {k: np.concatenate([np.asarray(o[k]) for o in outs])[:n] for k in outs[0]}


def packed_rows_multiple(config, mesh) -> int:
    """What packed batches round their row count to (0: batches stay padded, one row per example).

    config.data.pack_rows_multiple, times what the mesh splits the batch over, so every
    device (and so every host) gets whole rows.
    """
    if not config.data.packing:
        return 0  # (a task that cannot pack was refused with the config: config_validation.py)
    return math.lcm(int(config.data.pack_rows_multiple), mesh.shape["data"] * mesh.shape["fsdp"])


def _check_batch(batch_size: int, mesh) -> None:
    shards = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % shards or batch_size % jax.process_count():
        raise ValueError(f"config.train.batch_size={batch_size} must be a multiple of the {shards} batch shards "
                         f"of the mesh and of the {jax.process_count()} processes")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FinetuneProgram(harness.Program):
    """The harness's Program (its `frozen` is {}), and what fine-tuning's evaluation and hooks read besides."""

    objective: Objective
    schedule: Callable[[int], Any]
    predict: Callable  # jitted (params, global batch) -> the model's outputs, deterministic


def build_program(config, task, source: init_from.Source, names: list[str], example: dict,
                  num_steps: int) -> FinetuneProgram:
    """The task's model on the source's encoder, its step on config.mesh, and init(): the task's fresh head on the
    source's backbone (_pretrained). `example`: one featurized row, the model's inputs."""
    t_cfg = config.train
    has_pooler = "pooler" in source.params
    with building_for(packed_rows=bool(config.data.packing)):  # attention_impl=auto picks a kernel for these rows
        model = task.build_model(source.family, source.model_cfg, config.task, task.num_outputs(names), has_pooler)
    objective = task.objective(config.task)
    finetune_mup.check(t_cfg, source.model_cfg, source.path)  # a source handed in (the downstream probe's) too
    mup = finetune_mup.multipliers(t_cfg, task, source.family, source.model_cfg, config.task,
                                   task.num_outputs(names), has_pooler, example)  # None: standard
    tx, schedule = make_optimizer(t_cfg, num_steps, source.model_cfg.num_layers, source.family,
                                  None if mup is None else mup.learning_rate)
    mesh = make_mesh(config.mesh)
    _check_batch(t_cfg.batch_size, mesh)
    rules = logical_axis_rules(config.mesh)
    init = make_init_fn(model, tx, None, config.seed, example=example,
                        init_multipliers=None if mup is None else mup.init)
    abstract_state, shardings = abstract_state_and_shardings(init, mesh, rules)
    data_sharding = batch_sharding(mesh, rules)
    train_step = jax.jit(task.make_train_step(model, objective, tx, config),
                         in_shardings=(shardings, data_sharding, None), out_shardings=(shardings, None),
                         donate_argnums=0)
    predict = jax.jit(lambda params, batch: model.apply({"params": params}, batch, deterministic=True),
                      in_shardings=(shardings.params, data_sharding))

    def init_state():
        state = create_sharded_state(init, shardings)
        return state.replace(params=jax.device_put(_pretrained(state.params, source, config), shardings.params))

    return FinetuneProgram(mesh=mesh, rules=rules, abstract_state=abstract_state, state_shardings=shardings,
                           data_sharding=data_sharding, train_step=train_step, init=init_state, objective=objective,
                           schedule=schedule, predict=predict)


def run(config, workdir: str, stop_at_step: int | None = None, source: init_from.Source | None = None) -> dict:
    """Fine-tunes one seed in `workdir` (resuming from its checkpoints); returns results.json's content, or
    {"stopped_at": step} / {"preempted_at": step} when it stopped before the end.

    source: the encoder, when the caller holds it already (a pre-training run's current params, for its
    downstream probe); otherwise config.init_from is read. `config` is checked (config_validation.check_config)."""
    t_cfg = config.train
    task = get_task(config.task.kind)
    root = Workdir(workdir)
    lease = harness.check_storage(config, workdir)
    source = source or init_from.resolve(config.init_from, config.model)
    tokenizer_dir = str(root.tokenizer)

    def copy_tokenizer():
        if not tokenizer_lib.has_tokenizer(tokenizer_dir):
            hf_folder.copy_tokenizer_files(source.tokenizer_dir, tokenizer_dir)
            if not tokenizer_lib.has_tokenizer(tokenizer_dir):
                raise ValueError(f"config.init_from={config.init_from!r} has no tokenizer to fine-tune with")
        return tokenizer_lib.load_tokenizer(tokenizer_dir)

    tokenizer = harness.written_by_process_0("finetune_tokenizer_written", copy_tokenizer,
                                             lambda: tokenizer_lib.load_tokenizer(tokenizer_dir))
    fast = data.fast_tokenizer(tokenizer, config.data.max_seq_length)
    splits = read_splits(config.data, config.task)
    names = _labels(config, splits, workdir)
    features = {name: task.featurize(config.task, config.data, fast, split.rows, names)
                for name, split in splits.items()}
    if jax.process_index() == 0:
        resolved = json.loads(config.to_json_best_effort())
        resolved["model"] = source.model_cfg.to_dict()
        paths.write_atomically(root.config_json, json.dumps(resolved, indent=2, sort_keys=True))

    n_train = len(features["train"]["input_ids"])
    batch_size = t_cfg.batch_size
    num_steps = max(1, math.ceil(t_cfg.epochs * n_train / batch_size))
    steps_per_epoch = max(1, math.ceil(n_train / batch_size))
    cadence = make_cadence(t_cfg, config.checkpoint, num_steps, steps_per_epoch)
    last_step = num_steps if stop_at_step is None else min(stop_at_step, num_steps)

    example = {k: v[:1] for k, v in data.eval_batches(features["train"], 1)[0].items()}
    program = build_program(config, task, source, names, example, num_steps)

    rows_multiple = packed_rows_multiple(config, program.mesh)
    min_rows = data.typical_rows(features["train"], batch_size, rows_multiple) if rows_multiple else 0
    share = (jax.process_index(), jax.process_count())
    train_iter = data.train_iterator(features["train"], batch_size, math.ceil(t_cfg.epochs), config.seed,
                                     rows_multiple, min_rows, share)
    eval_sets = {name: data.eval_batches(f, batch_size, rows_multiple, min_rows, share) for name, f in features.items()}

    def scores_of(params, split: str) -> tuple[dict, dict]:
        """(outputs, loss and metrics) of `params` on a split."""
        f = features[split]
        outputs = predict_outputs(program.predict, params, eval_sets[split], program.data_sharding,
                                  len(f["input_ids"]))
        return outputs, task.evaluate(config.task, outputs, f, names, splits[split].rows)

    logging.info("fine-tuning %s from %s (%s, family %s): %d train / %d validation examples, %d labels, "
                 "%d steps (%d per epoch)", task.name, config.init_from, source.kind, source.family.name, n_train,
                 len(features["validation"]["input_ids"]), len(names), num_steps, steps_per_epoch)
    hooks = _FinetuneHooks(config, root, cadence, program.schedule, program.objective,
                           lambda state: scores_of(state.params, "validation")[1], task.headline_metric(config.task),
                           steps_per_epoch)
    outcome = harness.run(program, harness.Batches(train_iter), hooks, workdir, config, last_step, lease,
                          end_step=num_steps)
    if outcome.preempted:
        return {"preempted_at": outcome.step}
    if stop_at_step is not None and last_step < num_steps and not outcome.stopped_early:
        return {"stopped_at": last_step}

    params = outcome.state.params
    best_metric = config.early_stopping.metric
    if best_metric and "step" in hooks.best:
        params = _restore_best(root, program.abstract_state.params)
        logging.info("using the best params: %s %.4f at step %d", best_metric, hooks.best["value"],
                     hooks.best["step"])
        hooks.last_eval.clear()
    if hooks.last_eval.get("step") == int(outcome.state.step):  # the final params were just validated
        validation = hooks.last_eval["scores"]
    else:
        validation = scores_of(params, "validation")[1]
    # What a model that learned nothing scores here: the scoreboard and the diagnosis hold the run against it.
    chance = {"validation": task.chance(config.task, splits["train"].rows, splits["validation"].rows, names),
              "examples": len(splits["validation"].rows)}
    results = {"validation": validation, "num_steps": num_steps, "labels": names, "chance": chance}
    if "test" in features:
        outputs, results["test"] = scores_of(params, "test")
        lines = task.predictions(config.task, outputs, features["test"], splits["test"].rows, names)
        if jax.process_index() == 0:
            paths.write_atomically(root.predictions_jsonl, "".join(json.dumps(line) + "\n" for line in lines))
    results["diagnosis"] = _diagnose(config, workdir, task.headline_metric(config.task), chance)
    if jax.process_index() == 0:
        paths.write_atomically(root.results_json, json.dumps(results, indent=2))
        completion.write_done(workdir, outcome.step, num_steps, "finetune")  # last: the results are in
    logging.info("validation: %s", " | ".join(f"{k} {v:.4f}" for k, v in results["validation"].items()
                                              if "/" not in k))
    return results


class _FinetuneHooks:
    """Fine-tuning's cadence (bert_jax/finetune/cadence.py), validation with early stopping, and its epoch line."""

    def __init__(self, config, root, cadence, schedule, objective, validate, metric: str, steps_per_epoch: int):
        self.config, self.root, self.cadence, self.schedule = config, root, cadence, schedule
        self.objective, self.validate, self.metric, self.steps_per_epoch = objective, validate, metric, steps_per_epoch
        self.best = _read_best(root)
        self.last_eval: dict = {}

    def started(self, step, state, writer):
        logging.info("starting at step %d of %d", step, self.cadence.num_steps)
        if step == 0 and self.cadence.validates_at(0):  # the untrained model: where the learning curves start
            self.evaluate(0, state, writer)

    def logs_at(self, step):
        return step % self.cadence.log_every == 0

    def logged(self, step, row):
        row["train/learning_rate"] = float(self.schedule(step - 1))
        row["train/epoch"] = step / self.steps_per_epoch
        logging.info("step %d/%d | epoch %.2f | %s", step, self.cadence.num_steps, step / self.steps_per_epoch,
                     harness.headline(row, "train", self.objective.headline))

    def evaluates_at(self, step):
        return self.cadence.validates_at(step)

    def evaluate(self, step, state, writer) -> bool:
        """Scores the current params on the validation split, writes and logs them; keeps the best params."""
        scores = self.validate(state)
        self.last_eval.update(step=step, scores=scores)
        writer.write(step, {f"eval/{k}": v for k, v in scores.items()})
        logging.info("eval step %d%s | %s", step, " (before training)" if step == 0 else "",
                     " | ".join(f"{k} {v:.4f}" for k, v in scores.items() if "/" not in k))
        es = self.config.early_stopping
        if not es.metric or step == 0:
            return False
        if es.metric not in scores:
            raise ValueError(f"config.early_stopping.metric={es.metric!r}; the validation metrics are "
                             f"{sorted(scores)}")
        sign = -1 if es.metric in LOWER_IS_BETTER else 1
        if "value" not in self.best or sign * scores[es.metric] > sign * self.best["value"]:
            self.best = {"step": step, "value": scores[es.metric], "stale": 0}
            _save_best(self.root, state.params)
        else:
            self.best["stale"] = self.best.get("stale", 0) + 1
        if jax.process_index() == 0:
            paths.write_atomically(self.root.best_json, json.dumps(self.best))
        if es.patience and self.best["stale"] >= es.patience:
            logging.info("early stopping at step %d: %s has not improved for %d evaluations (best %.4f at step %d)",
                         step, es.metric, self.best["stale"], self.best["value"], self.best["step"])
            return True
        return False

    def saves_at(self, step):
        return step % self.cadence.save_every == 0

    def saved(self, step, writer):
        # Drawn with each checkpoint (once an epoch), not at every validation: rendering is host time the device
        # waits on.
        writer.plot(("loss", self.metric))

    def closing(self, writer):
        pass


def _pretrained(fresh_params, source, config) -> dict:
    """The fresh task model's params with the backbone from the source (and, if asked, a fresh pooler)."""
    fresh = jax.device_get(fresh_params)
    backbone = init_from.backbone_subset(source.params, fresh["backbone"])
    pooler = source.family.roles.pooler
    if config.train.reinit_pooler and pooler in backbone:
        backbone[pooler] = fresh["backbone"][pooler]
    return {**fresh, "backbone": backbone}


def _read_best(root: Workdir) -> dict:
    return json.loads(root.best_json.read_text()) if root.best_json.exists() else {}


def _save_best(root: Workdir, params) -> None:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(paths.absolute(root.best_params), params, force=True)
    checkpointer.wait_until_finished()


def _restore_best(root: Workdir, abstract_params):
    return ocp.StandardCheckpointer().restore(paths.absolute(root.best_params), abstract_params)


def _diagnose(config, workdir: str, metric: str, chance: dict) -> dict:
    """The learning-curve diagnosis (bert_jax/finetune/diagnosis.py), printed and written to DIR."""
    rows = read_rows(Workdir(workdir).metrics_jsonl)
    curves = diagnosis.Curves(
        train_loss=[(r["step"], r["train/loss"]) for r in rows if "train/loss" in r],
        val_loss=[(r["step"], r["eval/loss"]) for r in rows if "eval/loss" in r],
        val_metric=[(r["step"], r[f"eval/{metric}"]) for r in rows if f"eval/{metric}" in r],
        metric_name=metric, higher_is_better=True, chance=chance["validation"].get(metric),
        examples=chance["examples"])
    result = diagnosis.diagnose(curves, config.diagnosis)
    if jax.process_index() == 0:
        diagnosis.write(workdir, curves, result)
    logging.info("diagnosis: %s — %s", result.name, result.advice)
    print(f"diagnosis: {result.name} — {result.advice}")
    return {"name": result.name, "advice": result.advice}


def finetune(config, workdir: str, stop_at_step: int | None = None) -> dict:
    """One run, or (config.seeds = "0,1,2") one per seed in DIR/seed_<s> and their mean ± std; `config` is checked
    first (config_validation.check_config), before anything is created."""
    config = config_validation.check_config(config)
    seeds = config_validation.seeds(config)
    if not seeds:
        return run(config, workdir, stop_at_step)
    per_seed = {}
    for seed in seeds:
        c = config.copy_and_resolve_references()
        c.seed, c.seeds = seed, ""
        per_seed[seed] = run(c, str(Workdir(workdir).seed(seed)), stop_at_step)
        if "preempted_at" in per_seed[seed]:  # the same command resumes this seed, then runs the rest
            return {"seeds": per_seed}
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
        paths.write_atomically(Workdir(workdir).seeds_json, json.dumps(summary, indent=2))
        steps = per_seed[seeds[-1]]["num_steps"]
        completion.write_done(workdir, steps, steps, "finetune-seeds")
    return {"seeds": per_seed, "summary": summary}
