"""A wall-clock budget's calibrating start: how long a step takes here, measured once, then fixed for the run.

A wall-clock budget (`config.train.budget=8m`, bert_jax/train/budget.py) buys as many steps as fit, which depends on
the machine. So the first start of such a run measures: it builds stage 0's program and data as the run will, takes
the workdir's lease, trains one step (the compile) and then `config.train.budget_calibration_steps` more from a fresh
state on a throwaway iterator, and times those, the host's data waits and dispatches included, as the loop's step
time includes them. Nothing it trains is kept. The seconds per step become `config.train.budget_step_s`, which
resolves the budget into steps (budget.resolve); the run records it in DIR/config.json and config_history.jsonl,
and every later start of the workdir reads it back, so a relaunch trains exactly the steps the first start fixed.

The measuring steps and their compile are start-up, not budget: the goodput record counts them there.
"""
import time

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

from bert_jax.parallel.mesh import global_batch, host_data_share, make_mesh
from bert_jax.run import harness
from bert_jax.train import budget
from bert_jax.train import stages as stages_lib
from bert_jax.train import remat_auto
from bert_jax.train.run_tokenizer import prepare_run_tokenizer
from data_pipelines.loader import pipeline


def calibrate(config, workdir: str):
    """`config` (check_config's, its wall-clock budget unresolved) with its budget resolved at the measured speed."""
    steps = config.train.budget_calibration_steps
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"config.train.budget_calibration_steps={steps!r} must be an int >= 1")
    stage = stages_lib.plan(config)[0].config
    lease = harness.check_storage(stage, workdir)
    try:
        mesh = make_mesh(stage.mesh)
        _, program = remat_auto.build_here(stage, mesh)
        tokenizer = prepare_run_tokenizer(stage, workdir, program.teacher)
        host = host_data_share(program.data_sharding, stage.train.global_batch_size)
        batches = pipeline.build_train_iterator(
            stage.data, tokenizer, seed=config.seed,
            per_host_batch_size=stage.train.global_batch_size // host["process_count"], **host)
        step_s = time_steps(program, batches, steps)
    finally:
        lease.release()
    measured = config.copy_and_resolve_references()
    with measured.unlocked():
        measured.train.budget_step_s = step_s
    resolved, lines = budget.resolve(measured)
    logging.info("calibrated: %d steps of stage 0 took %.4g s each (the compile and the first step left out)",
                 steps, step_s)
    for line in lines:
        logging.info("%s", line)
    return resolved


def time_steps(program, batches, steps: int) -> float:
    """Seconds per step of `program` over `steps` steps after one that compiles, from a fresh state; the slowest
    host's, so that every host resolves the same steps."""
    frozen = program.load_frozen()
    with jax.set_mesh(program.mesh), nn.logical_axis_rules(program.rules):
        state = program.init()
        state, metrics = program.train_step(state, global_batch(next(batches), program.data_sharding), frozen)
        jax.block_until_ready(metrics)
        start = time.perf_counter()
        for _ in range(steps):
            state, metrics = program.train_step(state, global_batch(next(batches), program.data_sharding), frozen)
        jax.block_until_ready((state, metrics))
        seconds = (time.perf_counter() - start) / steps
    if jax.process_count() > 1:
        seconds = float(np.max(multihost_utils.process_allgather(np.float64(seconds))))
    return seconds
