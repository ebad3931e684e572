"""A resume continues the experiment its workdir started, or stops naming the keys that changed.

A workdir holds one run. Its first start records the resolved config (DIR/config.json, and the
first line of DIR/config_history.jsonl). A later start that resumes a checkpoint compares its own
resolved config with the recorded one, key by key:

- keys that change the experiment (the model, data and masking, optimizer and schedule, stages,
  the seed: everything not in PASSING) stop the run before anything is built, naming each key
  with its old and new value, unless `config.accept_changes` names it;
- keys in PASSING (logging, eval and log cadence, checkpoint cadence, the mesh, paths, loader
  threads) go through.

Every difference, accepted or passing, is appended to DIR/config_history.jsonl as one line
{"event": "resume", "step", "time", "accepted": {key: [old, new]}, "passed": {...}} before
config.json is rewritten to the config that now runs, so the record of what ran is never lost:
config.json says what runs now, the history says what ran before and from which step.

A key the recorded config lacks (the code gained it since the run started) is not a change: it
is logged. So is one the new code no longer has.

A refusal is one line saying what to do (the `--config.accept_changes=` that names every key), then one line per
key, old and new value as the stage the run resumes into has them (a staged run's sequence length and the
prediction cap it derives differ by stage). A key the run derives from another (DERIVED: the prediction cap under
`auto`, μP's resolved multipliers) follows the key the user changed, on that key's line, and is never asked for on its own: accepting the
user's key accepts it, and the history records both.
"""
from __future__ import annotations

import fnmatch
import json
import time

from absl import logging

from bert_jax import UserError
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir

# Keys (fnmatch patterns over dotted paths) that do not change what is trained. data.worker_count does:
# the batches depend on it (data_pipelines/loader/workers.py).
PASSING = (
    "logging.*", "checkpoint.*", "mesh.*", "distributed.*", "lease.*",
    "compilation_cache_dir", "libtpu_init_args", "deterministic_gpu_ops", "allow_data_change", "accept_changes",
    "license",  # what the exports' model cards say (bert_jax/train/model_card.py), not what is trained
    "init_from_hf", "grow_from",  # read only by a fresh start
    "lineage", "lineage.*", "averaged_from", "averaged_from.*",  # what a run came from (bert_jax/run/lineage.py)
    "run_identity", "run_identity.*",  # checked by bert_jax/run/run_identity.py
    "train.log_every_steps", "train.eval_every_steps", "train.nan_policy", "train.max_steps_ahead", "train.profile.*",
    "train.spike.*",  # like nan_policy: what a spike does (bert_jax/run/spike.py), not what is trained without one
    "train.budget_calibration_steps",  # read by a wall-clock budget's first start alone (bert_jax/train/budget.py)
    "data.num_eval_batches", "data.prefetch_buffer_size", "data.shard_cache_bytes",
    # Paths: what they hold is checked by the data fingerprint and the tokenizer's hash (run_identity.py).
    "data.path", "data.tokenizer.path", "data.tfds_data_dir", "data.mixture.*.path",
)


# Keys a run derives from others (`auto`, resolved by bert_jax/train/config_validation.py and per stage by
# bert_jax/train/stages.py): a change of one that comes with a change of a key it derives from is that key's.
# Keys and sources are fnmatch patterns: μP's multipliers (config_validation._resolve_mup) follow the model's shape.
DERIVED = {
    "data.max_predictions_per_seq": ("data.mask_rate", "data.max_seq_length", "data.mask_count"),
    "model.mup_multipliers*": ("model.parametrization", "model.mup_base_width", "model.*"),
    # Under train.budget (bert_jax/train/budget.py): the steps it buys and the schedule's clock follow the budget, its
    # measured speed, and whatever changes a step's cost or the schedule's stages.
    "train.budget_step_s": ("train.budget",),
    "train.num_steps": ("train.budget", "train.budget_step_s"),
    "train.budget_clock": ("train.budget", "train.budget_step_s", "train.*", "data.*", "model.*"),
}


class ExperimentChangedError(UserError):
    pass


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and tuples stay whole values (as JSON gives them: lists)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, tuple) else value
    return out


def passes(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in PASSING)


def accepted_keys(accept_changes: str) -> set[str]:
    """config.accept_changes "data.masking, train.num_steps" -> {"data.masking", "train.num_steps"}."""
    return {key.strip().removeprefix("config.") for key in (accept_changes or "").split(",") if key.strip()}


def differences(recorded: dict, current: dict) -> tuple[dict, dict]:
    """(experiment changes, passing changes), each {key: [old, new]}, between two configs as JSON dicts."""
    before, after = flatten(recorded), flatten(current)
    changed, passed = {}, {}
    for key in sorted(before.keys() | after.keys()):
        if key not in before or key not in after:
            if not passes(key):
                logging.warning("config key %s is %s since the run started (code changed): not counted as a change",
                                key, "new" if key not in before else "gone")
            continue
        if before[key] != after[key]:
            (passed if passes(key) else changed)[key] = [before[key], after[key]]
    return changed, passed


def followers(changed: dict) -> dict[str, list[str]]:
    """{changed key: the changed keys derived from it} (DERIVED); a derived key follows the first source that
    changed."""
    out: dict[str, list[str]] = {k: [] for k in changed if not _follows(k, changed)}
    for key in changed:
        source = _follows(key, changed)
        if source:
            out[source].append(key)
    return out


def _follows(key: str, changed: dict) -> str | None:
    for pattern, sources in DERIVED.items():
        if fnmatch.fnmatchcase(key, pattern):
            return next((other for source in sources for other in sorted(changed)
                         if fnmatch.fnmatchcase(other, source) and not _derived(other)), None)
    return None


def _derived(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in DERIVED)


def check_resume(recorded: dict | None, current: dict, accept_changes: str, workdir: str, step: int,
                 quoted: tuple[dict, dict] | None = None, where: str = "") -> dict | None:
    """The history line of this resume ({} -> nothing to record), or None for a fresh start.

    Raises ExperimentChangedError when a key that changes the experiment differs and is not accepted (nor derived
    from one that is). quoted: (recorded, current) configs of the stage the run resumes into, whose values the
    refusal quotes (default: the configs compared); where: that stage, for the message ("stage 2 of 2").
    """
    if recorded is None:
        return None
    changed, passed = differences(recorded, current)
    accepted = accepted_keys(accept_changes)
    refused = {k: derived for k, derived in followers(changed).items() if k not in accepted}
    if refused:
        before, after = (flatten(q) for q in quoted) if quoted else (flatten(recorded), flatten(current))

        def change(key: str) -> str:
            old, new = before.get(key, changed[key][0]), after.get(key, changed[key][1])
            return f"{key}: {json.dumps(old)} -> {json.dumps(new)}"

        lines = [f"{workdir} holds a run of another experiment (checkpoint at step {step}{where and ', ' + where}): "
                 f"resume with the config it started with ({Workdir(workdir).config_json}), use a new workdir, or "
                 f"accept, recorded in {Workdir(workdir).config_history.name}: "
                 f"--config.accept_changes={','.join(refused)}"]
        lines += [f"config.{change(k)}" + (f" ({'; '.join(change(d) for d in derived)}: follows it)" if derived else "")
                  for k, derived in refused.items()]
        raise ExperimentChangedError("\n".join(lines))
    for key in sorted(accepted - changed.keys()):
        logging.info("config.accept_changes names %s, which did not change", key)
    for key, (old, new) in changed.items():
        logging.warning("config.accept_changes: resuming at step %d with config.%s changed: %s -> %s",
                        step, key, json.dumps(old), json.dumps(new))
    if not (changed or passed):
        return {}
    return {"event": "resume", "step": step, "time": time.time(), "accepted": changed, "passed": passed}


def read_history(workdir: str) -> list[dict]:
    path = paths.fresh(Workdir(workdir).config_history)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_history(workdir: str, entry: dict) -> None:
    """Adds one line to DIR/config_history.jsonl: the file is rewritten whole (a bucket has no append)."""
    lines = [json.dumps(e, sort_keys=True) for e in read_history(workdir)] + [json.dumps(entry, sort_keys=True)]
    paths.write_atomically(Workdir(workdir).config_history, "\n".join(lines) + "\n")


def start_entry(config_json: dict) -> dict:
    """The history's first line: the resolved config the run started with."""
    return {"event": "start", "step": 0, "time": time.time(), "config": config_json}
