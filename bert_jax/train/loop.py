"""Pre-training as a program for the harness (bert_jax/run/harness.py): every family runs through it, and it
never asks which family it runs."""
import json

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.hf import folder as hf_folder
from bert_jax.train.config_validation import resolve_config, validate_config
from bert_jax.parallel.mesh import global_batch, make_mesh
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.train import perf
from bert_jax.run import completion, experiment, harness, run_identity
from bert_jax.train import stages as stages_lib
from bert_jax.train import teacher as teacher_lib
from bert_jax.train.program import build_program
from data_pipelines.loader import mixing, pipeline, workers
from data_pipelines.sources import mixture
from data_pipelines.tokenizers import tokenizer as tokenizer_lib


def _write_config(config, workdir: str, identity: dict, history_entry: dict | None) -> None:
    """config.json: the config that runs now; a start or a changed resume first goes into config_history.jsonl."""
    if jax.process_index() == 0:
        resolved = json.loads(config.to_json_best_effort())
        if history_entry is None:
            experiment.append_history(workdir, experiment.start_entry(resolved))
        elif history_entry:
            experiment.append_history(workdir, history_entry)
        resolved[run_identity.IDENTITY_KEY] = identity
        paths.write_atomically(Workdir(workdir).config_json, json.dumps(resolved, indent=2, sort_keys=True))


def _check_experiment(config, workdir: str) -> dict | None:
    """Before anything is built: a resume of another experiment stops, naming the keys (train/experiment.py).

    Returns the history entry of this start: None for a fresh one, {} for a resume that changed nothing."""
    steps = Workdir(workdir).checkpoint_steps()
    config_json = paths.fresh(Workdir(workdir).config_json)
    recorded = json.loads(config_json.read_text()) if steps and config_json.exists() else None
    return experiment.check_resume(recorded, json.loads(config.to_json_best_effort()),
                                   config.get("accept_changes", ""), workdir, steps[-1] if steps else 0)


def _recorded_worker_count(config, workdir: str):
    """`config`, its data.worker_count=auto on a resume replaced by the number the run started with.

    The batches depend on the worker count (data_pipelines/loader/workers.py): a run relaunched on
    a host of other cores resumes with its own batches instead of resolving `auto` anew (which the
    experiment check would then refuse)."""
    if config.data.get("worker_count") != workers.AUTO or not Workdir(workdir).checkpoint_steps():
        return config
    config_json = paths.fresh(Workdir(workdir).config_json)
    recorded = json.loads(config_json.read_text()).get("data", {}).get("worker_count") if config_json.exists() else None
    if not isinstance(recorded, int):
        return config
    logging.info("config.data.worker_count=auto -> %d, as the run started with (this host would resolve %d)",
                 recorded, workers.auto_worker_count())
    config = config.copy_and_resolve_references()
    with config.data.ignore_type():  # a copy holds "auto" as a str field
        config.data.worker_count = recorded
    return config


def _log_progress(step: int, num_steps: int, row: dict, objective) -> None:
    logging.info(
        "step %d/%d | %s | %.0f tok/s | MFU %.2f%% | ETA %s", step, num_steps,
        harness.headline(row, "train", objective.headline),
        row["perf/tokens_per_s"], 100 * row["perf/mfu"], perf.format_duration(row["perf/eta_s"]),
    )


def _evaluate(eval_step, params, eval_batches, objective, frozen, eval_sources=()) -> dict:
    """eval/<metric> over all batches; with eval_sources, (name, its number of batches) in the
    batches' order (a mixture's), also eval/<name>/<metric> per source."""
    def add(a, b):
        return b if a is None else jax.tree.map(np.add, a, b)

    sums = weights = None
    per_source = {}
    ends = np.cumsum([count for _, count in eval_sources])
    for index, batch in enumerate(eval_batches):
        s, w = eval_step(params, batch, index, frozen)
        sums, weights = add(sums, s), add(weights, w)
        if eval_sources:
            name = eval_sources[int(np.searchsorted(ends, index, side="right"))][0]
            source_sums, source_weights = per_source.get(name, (None, None))
            per_source[name] = (add(source_sums, s), add(source_weights, w))
    row = {f"eval/{k}": float(v) for k, v in jax.device_get(objective.metrics(sums, weights)).items()}
    for name, (s, w) in per_source.items():
        row.update({f"eval/{name}/{k}": float(v) for k, v in jax.device_get(objective.metrics(s, w)).items()})
    return row


def _data_metrics(train_iter) -> dict:
    """A mixture's data/<name>/sequences, tokens (cumulative, summed over hosts), fraction and epochs (the
    most any host's share completed); {} otherwise."""
    if not isinstance(train_iter, mixing.SourceCountingIterator):
        return {}
    counts = np.stack([train_iter.sequences, train_iter.tokens, train_iter.epochs])
    if jax.process_count() > 1:  # every process logs the same steps, so every one joins this gather
        gathered = np.asarray(multihost_utils.process_allgather(counts))
        counts = np.concatenate([gathered[:, :2].sum(axis=0), gathered[:, 2:].max(axis=0)])  # epochs: the most
    return mixing.count_metrics(train_iter.names, counts[0], counts[1], counts[2])


def _with_new_params(state, program, make_params):
    """The fresh state with its params replaced by make_params(fresh numpy params), on the same shards.

    The optimizer state is kept: it is the initial one (zero moments, step 0) either way.
    """
    # Gathered, not device_get: under FSDP on several hosts no host holds every shard.
    fresh = multihost_utils.process_allgather(state.params, tiled=True)
    params = make_params(fresh)
    params = jax.tree.map(lambda new, old: np.asarray(new, old.dtype), params, fresh)
    return state.replace(params=jax.device_put(params, program.state_shardings.params))


def train_and_evaluate(config, workdir: str, stop_at_step: int | None = None, downstream=None) -> dict:
    """Pre-trains per `config` in `workdir`, resuming from its newest checkpoint.

    Runs to config.train.num_steps, or stops (after checkpointing) at `stop_at_step`,
    which is how tests interrupt a run. Returns the last logged metrics. `downstream`: a probe
    (bert_jax/finetune/downstream_probe.py) that eval steps call when it is due; its row joins theirs. A config with
    stages (config.train.stages, bert_jax/train/stages.py) trains them one after another,
    each resumed from the checkpoint the stage before ended with; DONE follows the last.
    """
    config = _recorded_worker_count(config, workdir)
    stages = stages_lib.plan(config)
    if len(stages) == 1:
        return _train_stage(config, workdir, stop_at_step, downstream=downstream)
    record = resolve_config(config)  # what config.json and the experiment check hold: the run, stages and all
    validate_config(record, jax.process_count())  # every stage's config, before the first one trains
    last = config.train.num_steps if stop_at_step is None else min(stop_at_step, config.train.num_steps)
    metrics = {}
    for stage in stages:
        reached = (Workdir(workdir).checkpoint_steps() or [0])[-1]
        if stage.end <= reached:
            continue  # trained before this start
        if stage.start >= last:
            break
        logging.info("stage %d of %d: steps %d to %d%s", stage.index, len(stages) - 1, stage.start + 1, stage.end,
                     "".join(f", {k}={v}" for k, v in stage.changes.items()))
        metrics = _train_stage(stage.config, workdir, min(stage.end, last), record=record, stage=stage,
                               downstream=downstream)
        if (Workdir(workdir).checkpoint_steps() or [0])[-1] < min(stage.end, last):
            break  # preempted: the same command resumes in this stage
    return metrics


def _train_stage(config, workdir: str, stop_at_step: int | None = None, record=None,
                 stage: stages_lib.Stage | None = None, downstream=None) -> dict:
    """One span of a run: `config` (a stage's, for a staged run) to its stop; `record` is the whole run's config."""
    config = resolve_config(config)  # `auto` keys become numbers, logged; config.json records them
    validate_config(config, jax.process_count())
    lease = harness.check_storage(config, workdir, {
        "config.data.path": config.data.get("path", ""),
        "config.data.tokenizer.path": (config.data.get("tokenizer") or {}).get("path", ""),
        "config.init_from_hf": config.get("init_from_hf", ""),
        "config.distill.teacher": (config.get("distill") or {}).get("teacher", ""),
        **mixture.storage_paths(config.data)})
    history_entry = _check_experiment(record or config, workdir)
    program = build_program(config, make_mesh(config.mesh))
    teacher = program.teacher
    # Read before process 0 rewrites it below (after every process passed the tokenizer sync).
    previous_identity = run_identity.previous_identity(workdir)
    t_cfg = config.train
    last_step = t_cfg.num_steps if stop_at_step is None else min(stop_at_step, t_cfg.num_steps)

    tokenizer_dir = str(Workdir(workdir).tokenizer)
    init_from_hf = config.init_from_hf
    if init_from_hf:
        hf_folder.read_hf_config(init_from_hf)  # fails now, naming the path, if it is no HF folder
    # A fresh run starting from HF weights (or taught by a teacher) uses the tokenizer those weights knew.
    weights_key, weights_tokenizer = (("config.init_from_hf", init_from_hf) if init_from_hf else
                                      ("config.distill.teacher", teacher.tokenizer_dir) if teacher else ("", ""))
    if teacher is not None and config.data.tokenizer.get("path", ""):
        weights_tokenizer = ""  # the configured tokenizer stays; check_vocabulary below compares it

    def write_tokenizer():  # copied or trained
        if weights_tokenizer and not tokenizer_lib.has_tokenizer(tokenizer_dir):
            hf_folder.copy_tokenizer_files(weights_tokenizer, tokenizer_dir)
            if not tokenizer_lib.has_tokenizer(tokenizer_dir):
                raise ValueError(f"{weights_key}={weights_tokenizer!r} has no tokenizer (vocab.txt, tokenizer.json "
                                 f"or spiece.model) to tokenize with")
        return tokenizer_lib.prepare_tokenizer(config.data, tokenizer_dir)

    tokenizer = harness.written_by_process_0("tokenizer_written", write_tokenizer,
                                             lambda: tokenizer_lib.prepare_tokenizer(config.data, tokenizer_dir))
    if teacher is not None:
        teacher_lib.check_vocabulary(teacher, tokenizer, tokenizer_dir)
    identity = run_identity.run_identity(config.data, tokenizer_dir)
    run_identity.check_resume(previous_identity, identity, workdir, config.get("allow_data_change", False))
    _write_config(record or config, workdir, identity, history_entry)
    # A model that reads pad_token_id (e.g. to offset positions) must agree with the tokenizer.
    pad_token_id = config.model.get("pad_token_id")
    if pad_token_id is not None and pad_token_id != tokenizer_lib.special_ids(tokenizer).pad:
        raise ValueError(
            f"config.model.pad_token_id={pad_token_id} but the tokenizer in {workdir}/tokenizer pads with id "
            f"{tokenizer_lib.special_ids(tokenizer).pad}; set --config.model.pad_token_id to that id"
        )
    if tokenizer.get_vocab_size() > config.model.vocab_size:
        raise ValueError(
            f"the tokenizer in {workdir}/tokenizer has {tokenizer.get_vocab_size()} tokens, more than "
            f"config.model.vocab_size={config.model.vocab_size}"
        )
    per_host_batch = t_cfg.global_batch_size // jax.process_count()
    host = dict(process_index=jax.process_index(), process_count=jax.process_count())
    train_iter = pipeline.build_train_iterator(  # a stage's iterator starts fresh at its start, on its own seed
        config.data, tokenizer, seed=stages_lib.data_seed(config.seed, stage.index if stage else 0),
        per_host_batch_size=per_host_batch, first_step=stage.start if stage else 0, **host
    )
    eval_sets = pipeline.build_eval_sets(
        config.data, tokenizer, seed=config.seed, per_host_batch_size=per_host_batch, **host
    )
    eval_host_batches = [batch for _, batches in eval_sets for batch in batches]
    baseline = pipeline.most_frequent_token_accuracy(eval_host_batches)

    # The frozen network (a distillation teacher), loaded once; {} without one.
    teacher_params, frozen = program.load_frozen(config.data)

    def init_state():
        state = program.init()
        if init_from_hf:
            state = _with_new_params(state, program, lambda fresh: hf_folder.import_params(
                program.family, config.model, init_from_hf, fresh))
        if teacher is not None and config.distill.init_student_from_teacher:
            state = _with_new_params(state, program, lambda fresh: teacher_lib.student_from_teacher(
                fresh, teacher_params, config.model.num_layers, teacher.model_cfg.num_layers, teacher.path))
        return state

    run = harness.Program(
        mesh=program.mesh, rules=program.rules, abstract_state=program.abstract_state, init_state=init_state,
        train_step=lambda state, batch: program.train_step(state, batch, frozen),
        data_sharding=program.data_sharding, train_iter=train_iter, nan_policy=t_cfg.nan_policy,
        iterator_from_step=stage.start if stage else 0, data_may_end=bool(mixture.stopping_sources(config.data)))
    flops = perf.step_flops(program, config)
    peak, peak_source = perf.peak_flops_per_device(config.logging.peak_flops_per_device)
    logging.info("%.3g FLOPs/step (formula in bert_jax/train/perf.py); peak %.3g FLOP/s/device (%s)",
                 flops, peak, peak_source)
    meter = perf.PerfMeter(flops, t_cfg.global_batch_size * config.data.max_seq_length,
                           peak * jax.device_count(), t_cfg.num_steps)
    hooks = _PretrainHooks(config, program, frozen, eval_host_batches, baseline, meter, last_step, workdir)
    hooks.downstream = downstream
    hooks.train_iter = train_iter
    hooks.eval_sources = [(name, len(batches)) for name, batches in eval_sets if name]
    outcome = harness.run(run, hooks, workdir, config, last_step, lease)
    if (outcome.step >= t_cfg.num_steps or outcome.data_ended) and not outcome.preempted and jax.process_index() == 0:
        completion.write_done(workdir, outcome.step, t_cfg.num_steps, "pretrain")
    return hooks.last_metrics


class _PretrainHooks:
    """Pre-training's cadence (config.train.*_every_steps), its MLM evaluation and its speed line."""

    def __init__(self, config, program, frozen, eval_host_batches, baseline: float, meter, last_step: int,
                 workdir: str):
        self.workdir = workdir
        self.downstream = None  # a downstream probe (bert_jax/finetune/downstream_probe.py), set by the caller
        self.config, self.program, self.frozen, self.meter = config, program, frozen, meter
        self.eval_host_batches, self.baseline, self.last_step = eval_host_batches, baseline, last_step
        self.t_cfg, self.objective = config.train, program.objective
        self.headline = ("loss",) + self.objective.headline
        self.last_metrics: dict = {}
        self.train_iter, self.eval_sources = None, []  # a mixture's per-source counts and eval sets

    def started(self, step, state, writer):
        logging.info("starting at step %d of %d (workdir %s)", step, self.t_cfg.num_steps, self.workdir)
        self.eval_batches = [global_batch(b, self.program.data_sharding) for b in self.eval_host_batches]
        self.meter.start(step)

    def logs_at(self, step):
        return step % self.t_cfg.log_every_steps == 0

    def logged(self, step, row):
        row["train/learning_rate"] = float(self.program.schedule(step - 1))
        row.update(self.meter.measure(step))
        row.update(_data_metrics(self.train_iter))
        self.last_metrics.update(row)
        _log_progress(step, self.t_cfg.num_steps, row, self.objective)

    def evaluates_at(self, step):
        return step % self.t_cfg.eval_every_steps == 0 or step == self.last_step

    def evaluate(self, step, state, writer):
        row = _evaluate(self.program.eval_step, state.params, self.eval_batches, self.objective, self.frozen,
                        self.eval_sources)
        row["eval/most_frequent_token_accuracy"] = self.baseline
        if self.downstream is not None and self.downstream.due(step):  # before meter.start: not train time
            row.update(self.downstream(step, state.params))
        writer.write(step, row)
        self.last_metrics.update(row)
        logging.info("eval step %d | %s (MLM always-most-frequent-token: %.4f)",
                     step, harness.headline(row, "eval", self.objective.headline), self.baseline)
        for name, _ in self.eval_sources:
            logging.info("eval step %d | source %s | %s", step, name,
                         harness.headline(row, f"eval/{name}", self.objective.headline))
        writer.plot(self.headline)
        self.meter.start(step)  # eval time is not train time
        return False

    def saves_at(self, step):
        return step % self.config.checkpoint.every_steps == 0

    def saved(self, step, writer):
        pass

    def closing(self, writer):
        writer.plot(self.headline)

    def data_ended(self, step):
        """A source that stops (config.data.mixture.<name>.on_exhausted="stop") ran out: data/<name>/exhausted = 1
        in the last step's row. Every host is here at once; the one whose share ran out names the source."""
        names = self.train_iter.names
        if not self.train_iter.ended:  # another host's share ended: this one's last batch was drawn, not trained
            self.train_iter.forget_last_batch()
        index = names.index(self.train_iter.ended) if self.train_iter.ended else len(names)
        if jax.process_count() > 1:
            index = int(np.min(multihost_utils.process_allgather(np.int32(index))))
        name = names[index]
        logging.warning("source %r ran out after step %d (config.data.mixture.%s.on_exhausted='stop'): "
                        "the run ends at step %d, its last full batch", name, step, name, step)
        row = {f"data/{name}/exhausted": 1.0}
        self.last_metrics.update(row)
        return row
