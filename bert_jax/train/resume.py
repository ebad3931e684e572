"""A resume continues its workdir's experiment: the check, with the values of the stage the run resumes into.

bert_jax/run/experiment.py compares two configs key by key; this is where a pre-training run's configs come from:
the workdir's config.json and the config now asked for, each planned into its stages (bert_jax/train/stages.py), so
that a refusal quotes the sequence length and prediction cap of the stage the run would train next, not stage 0's.
check_config runs it where a command starts, before any file is created and before anything else is logged; the
loop runs it again before each stage (the library's entry, `train`, may be called without check_config).
"""
import json

import bert_jax
from bert_jax.run import completion, experiment, run_identity
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir, config_from_json
from bert_jax.train import stages as stages_lib


def check_experiment(config, workdir: str) -> dict | None:
    """Before anything is built or written: a resume of another experiment (a finished run's too) stops, naming the
    keys (bert_jax/run/experiment.py) with the values of the stage the run resumes into.

    `config`: the whole run's, as check_config resolved it. Returns the history entry of this start: None for a
    fresh one, {} for a resume that changed nothing. A finished run (DONE) is checked the same way, and an accepted
    change that would train nothing (num_steps not raised past it) is refused too."""
    run = Workdir(workdir)
    steps = run.checkpoint_steps()
    config_json = paths.fresh(run.config_json)
    recorded = json.loads(config_json.read_text()) if steps and config_json.exists() else None
    current = json.loads(config.to_json_best_effort())
    quoted, where = None, ""
    stages = stages_lib.plan(config)
    if recorded is not None and len(stages) > 1:
        stage = next((s for s in stages if s.end > steps[-1]), stages[-1])
        then = {k: v for k, v in recorded.items() if k != run_identity.IDENTITY_KEY}
        try:  # the recorded run's own stage, as it would resume into it
            before = stages_lib.plan(config_from_json(json.dumps(then)))[stage.index].config
            quoted = tuple(json.loads(c.to_json_best_effort()) for c in (before, stage.config))
        except (ValueError, KeyError, IndexError):  # stages changed too: the whole configs are quoted
            quoted = None
        where = f"stage {stage.index + 1} of {len(stages)}"
    entry = experiment.check_resume(recorded, current, config.accept_changes, workdir, steps[-1] if steps else 0,
                                    quoted, where)
    if entry and entry["accepted"] and steps[-1] >= config.train.num_steps and completion.read_done(workdir):
        # Accepted, the change would train nothing, and the command would claim success for a run that never was.
        raise bert_jax.UserError(
            f"{workdir} is done at step {steps[-1]}: accepting config.{', config.'.join(entry['accepted'])} would "
            f"train nothing; use a new workdir (or raise config.train.num_steps, accepting it, to train on)")
    return entry
