"""Pre-training, read top to bottom as the stages of a run: the config's stages one after another, and for each
the storage and experiment checks, the program, the tokenizer, the data, then the harness (bert_jax/run/harness.py)
running the program with pre-training's hooks. Every family runs through it, and it never asks which family it runs.
"""
import json

import jax
from absl import logging

from bert_jax.parallel.mesh import host_data_share, make_mesh
from bert_jax.run import completion, experiment, harness, lineage, run_identity
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.train import branch, budget, budget_calibration
from bert_jax.train import stages as stages_lib
from bert_jax.train.config_validation import check_config
from bert_jax.train.hooks import PretrainHooks
from bert_jax.train import remat_auto
from bert_jax.train.resume import check_experiment
from bert_jax.train.run_tokenizer import prepare_run_tokenizer
from data_pipelines.loader import pipeline
from data_pipelines.sources import mixture


def train_and_evaluate(config, workdir: str, stop_at_step: int | None = None, downstream=None) -> dict:
    """`train` on `config` as written: checked first (check_config), before anything is created. The library's
    entry (tests, benches); the pretrain command checks the config itself, then calls `train`."""
    return train(check_config(config, workdir, jax.process_count()), workdir, stop_at_step, downstream)


def train(config, workdir: str, stop_at_step: int | None = None, downstream=None) -> dict:
    """Pre-trains per `config`, as check_config returned it, in `workdir`, resuming from its newest checkpoint.

    Runs to config.train.num_steps, or stops (after checkpointing) at `stop_at_step`,
    which is how tests interrupt a run. Returns the last logged metrics. `downstream`: a probe
    (bert_jax/finetune/downstream_probe.py) that eval steps call when it is due; its row joins theirs. A config with
    stages (config.train.stages, bert_jax/train/stages.py) trains them one after another,
    each resumed from the checkpoint the stage before ended with; DONE follows the last. A wall-clock budget
    (config.train.budget) whose speed no start has measured yet is calibrated first (bert_jax/train/budget.py).
    """
    if budget.needs_calibration(config):
        config = budget_calibration.calibrate(config, workdir)
    stages = stages_lib.plan(config)
    last = config.train.num_steps if stop_at_step is None else min(stop_at_step, config.train.num_steps)
    # A finished run is a resume like any other: a changed experiment stops here, before anything is created.
    check_experiment(config, workdir)
    run = Workdir(workdir)
    reached = branch.reached(config, workdir)
    if completion.read_done(workdir) is not None:
        if reached >= last:
            print(f"done at step {reached}; nothing to train (DONE in {workdir})", flush=True)
            return {}
        if jax.process_index() == 0:  # trains on (num_steps raised, accepted): not finished until it is again
            paths.fresh(run.done).unlink()
    while True:
        try:
            return _train_stages(config, workdir, stages, stop_at_step, last, downstream)
        except harness.Rewound as rewound:  # the unreadable checkpoint is set aside: plan as a relaunch would
            logging.warning("%s: the stages are planned again from step %d", rewound, rewound.step)


def _train_stages(config, workdir: str, stages: list, stop_at_step: int | None, last: int, downstream) -> dict:
    """Trains the stages not yet trained, each from the checkpoint the one before ended with."""
    if len(stages) == 1 and not stages[0].source:  # a stage 0 a ramp or schedule changes is a stage like any other
        return _train_stage(config, workdir, stop_at_step, downstream=downstream)
    metrics = {}
    for stage in stages:
        reached = branch.reached(config, workdir)
        if stage.end <= reached:
            continue  # trained before this start
        if stage.start >= last:
            break
        logging.info("stage %d of %d: steps %d to %d%s", stage.index + 1, len(stages), stage.start + 1, stage.end,
                     "".join(f", {k}={_value(stage.config, k)}" for k in stage.changes))
        metrics = _train_stage(stage.config, workdir, min(stage.end, last), record=config, stage=stage,
                               downstream=downstream)
        if branch.reached(config, workdir) < min(stage.end, last):
            break  # preempted: the same command resumes in this stage
    return metrics


def _train_stage(config, workdir: str, stop_at_step: int | None = None, record=None,
                 stage: stages_lib.Stage | None = None, downstream=None) -> dict:
    """One span of a run: `config` (a stage's, for a staged run) to its stop; `record` is the whole run's config."""
    last_step = config.train.num_steps if stop_at_step is None else min(stop_at_step, config.train.num_steps)

    # ----------------------------------------------------------------------------------------------------------
    # Experiment and storage: a resume of another experiment refused (before the lease: a refusal leaves the workdir
    # as it was found), the workdir writable (the inputs were checked with the config), the lease taken.
    # ----------------------------------------------------------------------------------------------------------
    history_entry = check_experiment(record or config, workdir)  # before the lease: a refusal leaves no trace
    lease = harness.check_storage(config, workdir)

    # ----------------------------------------------------------------------------------------------------------
    # The program: the step compiled for the mesh, the state a fresh run starts from, a distillation teacher.
    # ----------------------------------------------------------------------------------------------------------
    mesh = make_mesh(config.mesh)
    _, program = remat_auto.build_here(config, mesh)

    # ----------------------------------------------------------------------------------------------------------
    # The tokenizer, the run's identity (its data and tokenizer: a resume on other data stops) and config.json.
    # ----------------------------------------------------------------------------------------------------------
    previous_identity = run_identity.previous_identity(workdir)  # before process 0 rewrites it below
    tokenizer = prepare_run_tokenizer(config, workdir, program.teacher)
    identity = run_identity.run_identity(config.data, str(Workdir(workdir).tokenizer))
    run_identity.check_resume(previous_identity, identity, workdir, config.allow_data_change)
    _write_config(record or config, workdir, identity, history_entry)

    # ----------------------------------------------------------------------------------------------------------
    # The data: this host's share of every batch. A stage's stream starts fresh at its start, on its own seed; a
    # branch's first start goes on with its parent's state and, when its data is unchanged, its parent's stream.
    # ----------------------------------------------------------------------------------------------------------
    host = host_data_share(program.data_sharding, config.train.global_batch_size)  # hosts that hold the same rows
    host["per_host_batch_size"] = config.train.global_batch_size // host["process_count"]  # read the same stream
    seed, first_step = branch.iterator_origin(config, stage)
    train_iter = pipeline.build_train_iterator(config.data, tokenizer, seed=seed, first_step=first_step, **host)
    eval_sets = pipeline.build_eval_sets(config.data, tokenizer, seed=config.seed, **host)
    batches = harness.Batches(train_iter, restored_after=first_step,
                              may_end=bool(mixture.stopping_sources(config.data)))
    if config.branch_from and not Workdir(workdir).checkpoint_steps():
        program = branch.program_for_branch(
            config, program, train_iter if branch.continues_iterator(config, stage) else None)

    # ----------------------------------------------------------------------------------------------------------
    # Train, evaluate, checkpoint (the harness, with pre-training's hooks); DONE once the last step is reached.
    # ----------------------------------------------------------------------------------------------------------
    hooks = PretrainHooks(config, program, workdir, last_step, train_iter, eval_sets, downstream,
                          stages_lib.plan(record or config), data_share=host["process_index"])
    outcome = harness.run(program, batches, hooks, workdir, config, last_step, lease)
    num_steps = config.train.num_steps
    if (outcome.step >= num_steps or outcome.data_ended) and not outcome.preempted and jax.process_index() == 0:
        completion.write_done(workdir, outcome.step, num_steps, "pretrain")
    return hooks.last_metrics


def _write_config(config, workdir: str, identity: dict, history_entry: dict | None) -> None:
    """config.json: the config that runs now; a start or a changed resume first goes into config_history.jsonl."""
    if jax.process_index() == 0:
        resolved = json.loads(config.to_json_best_effort())
        if history_entry is None:
            experiment.append_history(workdir, experiment.start_entry(resolved))
        elif history_entry:
            experiment.append_history(workdir, history_entry)
        resolved[run_identity.IDENTITY_KEY] = identity
        ref = branch.parent(config)
        if ref is not None:  # what it branched from, as recorded at its first start (the parent may be gone since)
            resolved[lineage.KEY] = lineage.read(workdir) or lineage.of_branch(ref.workdir, ref.step)
        paths.write_atomically(Workdir(workdir).config_json, json.dumps(resolved, indent=2, sort_keys=True))


def _value(config, key: str):
    """config's value at a dotted path ("data.max_seq_length")."""
    node = config
    for part in key.split("."):
        node = node[part]
    return node
