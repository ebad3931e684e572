"""The one train loop: every family runs through it, and it never asks which family it runs."""
import json

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.checkpoint import hf_folder
from bert_jax.checkpoint import manager as ckpt
from bert_jax.config_validation import validate_config
from bert_jax.parallel import distributed
from bert_jax.parallel.mesh import global_batch, make_mesh
from bert_jax.storage import paths, preflight
from bert_jax.train import determinism, perf, run_identity
from bert_jax.train import teacher as teacher_lib
from bert_jax.train.metrics_writer import MetricsWriter
from bert_jax.train.preemption import PreemptionWatch
from bert_jax.train.program import build_program
from data_pipelines import pipeline
from data_pipelines import tokenizer as tokenizer_lib


class NonFiniteLossError(RuntimeError):
    pass


def _write_config(config, workdir: str, identity: dict) -> None:
    if jax.process_index() == 0:
        resolved = json.loads(config.to_json_best_effort())
        resolved[run_identity.IDENTITY_KEY] = identity
        paths.write_atomically(paths.path(workdir) / "config.json", json.dumps(resolved, indent=2, sort_keys=True))


def nonfinite_steps(pending: list, nan_policy: str) -> list[int]:
    """Steps among `pending` whose loss or gradient was not finite; under policy `stop`, raises at the first."""
    bad = [step for step, m in pending if float(m["nonfinite"]) > 0]
    if bad and nan_policy == "stop":
        raise NonFiniteLossError(
            f"non-finite loss or gradient at step {bad[0]}; the update was not applied and no checkpoint "
            f"holds it. Set config.train.nan_policy=skip to skip such steps instead."
        )
    return bad


def host_metrics(pending: list, nan_policy: str) -> dict:
    """Means of the device metrics of the steps since the last log, over the steps that were applied."""
    pending = jax.device_get(pending)  # one transfer for all the steps since the last log
    bad = nonfinite_steps(pending, nan_policy)
    host = [m for step, m in pending if step not in bad] or [pending[-1][1]]
    out = {f"train/{k}": float(np.mean([m[k] for m in host])) for k in host[0] if k != "nonfinite"}
    out["train/skipped_steps"] = float(len(bad))
    return out


def headline(row: dict, split: str, objective) -> str:
    return " | ".join(f"{name} {row[f'{split}/{name}']:.4f}" for name in ("loss",) + objective.headline)


def _log_progress(step: int, num_steps: int, row: dict, objective) -> None:
    logging.info(
        "step %d/%d | %s | %.0f tok/s | MFU %.2f%% | ETA %s", step, num_steps, headline(row, "train", objective),
        row["perf/tokens_per_s"], 100 * row["perf/mfu"], perf.format_duration(row["perf/eta_s"]),
    )


def _evaluate(eval_step, params, eval_batches, objective, frozen) -> dict:
    sums = weights = None
    for index, batch in enumerate(eval_batches):
        s, w = eval_step(params, batch, index, frozen)
        sums = s if sums is None else jax.tree.map(np.add, sums, s)
        weights = w if weights is None else jax.tree.map(np.add, weights, w)
    metrics = objective.metrics(sums, weights)
    return {f"eval/{k}": float(v) for k, v in jax.device_get(metrics).items()}


def _with_new_params(state, program, make_params):
    """The fresh state with its params replaced by make_params(fresh numpy params), on the same shards.

    The optimizer state is kept: it is the initial one (zero moments, step 0) either way.
    """
    # Gathered, not device_get: under FSDP on several hosts no host holds every shard.
    fresh = multihost_utils.process_allgather(state.params, tiled=True)
    params = make_params(fresh)
    params = jax.tree.map(lambda new, old: np.asarray(new, old.dtype), params, fresh)
    return state.replace(params=jax.device_put(params, program.state_shardings.params))


def _check_storage(config, workdir: str) -> None:
    """Before anything is built: the workdir is writable and bucket inputs readable, or a StorageError says why."""
    preflight.check_checkpoint_store(workdir)
    preflight.check_writable(workdir, jax.process_index())
    for key, url in (("config.data.path", config.data.get("path", "")),
                     ("config.data.tokenizer.path", (config.data.get("tokenizer") or {}).get("path", "")),
                     ("config.init_from_hf", config.get("init_from_hf", "")),
                     ("config.distill.teacher", (config.get("distill") or {}).get("teacher", ""))):
        if url and paths.is_remote(url):
            preflight.check_readable(url, key)


def train_and_evaluate(config, workdir: str, stop_at_step: int | None = None) -> dict:
    """Pre-trains per `config` in `workdir`, resuming from its newest checkpoint.

    Runs to config.train.num_steps, or stops (after checkpointing) at `stop_at_step`,
    which is how tests interrupt a run. Returns the last logged metrics.
    """
    validate_config(config, jax.process_count())
    _check_storage(config, workdir)
    program = build_program(config, make_mesh(config.mesh))
    objective, teacher = program.objective, program.teacher
    determinism.check_xla_flags(config)
    if not paths.is_remote(workdir):  # (a bucket has no folders to make)
        paths.path(workdir).mkdir(parents=True, exist_ok=True)
    # Read before process 0 rewrites it below (after every process passed the tokenizer sync).
    previous_identity = run_identity.previous_identity(workdir)
    t_cfg = config.train
    last_step = t_cfg.num_steps if stop_at_step is None else min(stop_at_step, t_cfg.num_steps)

    tokenizer_dir = str(paths.path(workdir) / "tokenizer")
    init_from_hf = config.init_from_hf
    if init_from_hf:
        hf_folder.read_hf_config(init_from_hf)  # fails now, naming the path, if it is no HF folder
    # A fresh run starting from HF weights (or taught by a teacher) uses the tokenizer those weights knew.
    weights_key, weights_tokenizer = (("config.init_from_hf", init_from_hf) if init_from_hf else
                                      ("config.distill.teacher", teacher.tokenizer_dir) if teacher else ("", ""))
    if teacher is not None and config.data.tokenizer.get("path", ""):
        weights_tokenizer = ""  # the configured tokenizer stays; check_vocabulary below compares it
    # Process 0 writes the tokenizer (copied or trained); the others wait, then load that one.
    if jax.process_index() == 0:
        if weights_tokenizer and not tokenizer_lib.has_tokenizer(tokenizer_dir):
            hf_folder.copy_tokenizer_files(weights_tokenizer, tokenizer_dir)
            if not tokenizer_lib.has_tokenizer(tokenizer_dir):
                raise ValueError(f"{weights_key}={weights_tokenizer!r} has no tokenizer (vocab.txt, tokenizer.json "
                                 f"or spiece.model) to tokenize with")
        tokenizer = tokenizer_lib.prepare_tokenizer(config.data, tokenizer_dir)
    distributed.sync("tokenizer_written")
    if jax.process_index() != 0:
        tokenizer = tokenizer_lib.prepare_tokenizer(config.data, tokenizer_dir)
    if teacher is not None:
        teacher_lib.check_vocabulary(teacher, tokenizer, tokenizer_dir)
    identity = run_identity.run_identity(config.data, tokenizer_dir)
    run_identity.check_resume(previous_identity, identity, workdir, config.get("allow_data_change", False))
    _write_config(config, workdir, identity)
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
    train_iter = pipeline.build_train_iterator(
        config.data, tokenizer, seed=config.seed, per_host_batch_size=per_host_batch, **host
    )
    eval_host_batches = pipeline.build_eval_batches(
        config.data, tokenizer, seed=config.seed, per_host_batch_size=per_host_batch, **host
    )
    baseline = pipeline.most_frequent_token_accuracy(eval_host_batches)

    manager = ckpt.make_manager(paths.absolute(paths.path(workdir) / "checkpoints"), config.checkpoint)
    state = ckpt.restore_latest(manager, program.abstract_state, train_iter)
    # The frozen network (a distillation teacher), loaded once; {} without one.
    teacher_params, frozen = program.load_frozen(config.data)
    if state is None:
        state = program.init()
        if init_from_hf:
            state = _with_new_params(state, program, lambda fresh: hf_folder.import_params(
                program.family, config.model, init_from_hf, fresh))
        if teacher is not None and config.distill.init_student_from_teacher:
            state = _with_new_params(state, program, lambda fresh: teacher_lib.student_from_teacher(
                fresh, teacher_params, config.model.num_layers, teacher.model_cfg.num_layers, teacher.path))
    start = int(state.step)
    logging.info("starting at step %d of %d (workdir %s)", start, t_cfg.num_steps, workdir)
    if start >= last_step:
        logging.info("the checkpoint is already at step %d: nothing to train", start)

    writer = MetricsWriter(workdir, config, start)
    data_sharding = program.data_sharding
    flops = perf.step_flops(program, config)
    peak, peak_source = perf.peak_flops_per_device(config.logging.peak_flops_per_device)
    meter = perf.PerfMeter(flops, t_cfg.global_batch_size * config.data.max_seq_length,
                           peak * jax.device_count(), t_cfg.num_steps)
    logging.info("%.3g FLOPs/step (formula in bert_jax/train/perf.py); peak %.3g FLOP/s/device (%s)",
                 flops, peak, peak_source)

    last_metrics: dict = {}
    try:
        with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules), PreemptionWatch() as watch:
            eval_batches = [global_batch(b, data_sharding) for b in eval_host_batches]
            pending = []
            meter.start(start)
            for step in range(start + 1, last_step + 1):
                state, metrics = program.train_step(state, global_batch(next(train_iter), data_sharding), frozen)
                pending.append((step, metrics))
                is_last = step == last_step
                if step % t_cfg.log_every_steps == 0 or is_last:
                    row = host_metrics(pending, t_cfg.nan_policy)
                    pending = []
                    row["train/learning_rate"] = float(program.schedule(step - 1))
                    row.update(meter.measure(step))
                    writer.write(step, row)
                    last_metrics.update(row)
                    _log_progress(step, t_cfg.num_steps, row, objective)
                if step % t_cfg.eval_every_steps == 0 or is_last:
                    row = _evaluate(program.eval_step, state.params, eval_batches, objective, frozen)
                    row["eval/most_frequent_token_accuracy"] = baseline
                    writer.write(step, row)
                    last_metrics.update(row)
                    logging.info("eval step %d | %s (MLM always-most-frequent-token: %.4f)",
                                 step, headline(row, "eval", objective), baseline)
                    writer.plot(("loss",) + objective.headline)
                    meter.start(step)  # eval time is not train time
                preempted = watch.should_stop(step)
                if step % config.checkpoint.every_steps == 0 or is_last or preempted:
                    nonfinite_steps(pending, t_cfg.nan_policy)  # a NaN step stops the run before it is saved
                    ckpt.save(manager, step, state, train_iter)
                    writer.sync()  # a bucket gets the metrics up to this step (see metrics_writer.py)
                if preempted:
                    logging.warning("preempted: checkpoint of step %d saved; run the same command to resume", step)
                    break
    finally:
        # Also on an error: the saves already started complete, so the run can resume from them.
        try:
            ckpt.wait_until_finished(manager)
        finally:
            manager.close()
            writer.plot(("loss",) + objective.headline)
            writer.close()
    return last_metrics
