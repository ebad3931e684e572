"""Where a run came from: the ancestors of a branch, and the sources of an averaged run, as its config.json says.

A branch (`config.branch_from=DIR:STEP`) starts a new workdir from another run's checkpoint. Its config.json holds
KEY: the ancestors, root first and parent last, each {"workdir", "step", "config_digest"}, so a branch of a branch
still names the run everything started from, and the digest says whether an ancestor's experiment was changed
after the branch was taken (a resume with `accept_changes` rewrites config.json; the digest would then differ).
An averaged run (`bert-jax average`) holds AVERAGED_KEY: [{"workdir", "step", "ema", "weight"}].

The readers of runs (wandb's grouping, `sweep summary`, the scoreboard, `inspect`) show it in one form, `describe`.
"""
from __future__ import annotations

import hashlib
import json

from bert_jax import UserError
from bert_jax.run import experiment
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir

KEY = "lineage"
AVERAGED_KEY = "averaged_from"
# Not part of what a run trains: where it came from, and what identifies its data and code (run_identity.py, a
# PASSING key too, checked on its own).
_NOT_DIGESTED = (KEY, AVERAGED_KEY)


def _config_json(workdir: str) -> dict | None:
    path = paths.fresh(Workdir(workdir).config_json)
    return json.loads(path.read_text()) if path.exists() else None


def digest(config_json: dict) -> str:
    """12 hex digits of the sha256 of a config's experiment: every key a resume would refuse to change.

    The keys a passing resume may change (experiment.PASSING: logging, checkpoint cadence, mesh, paths) are left
    out, so a run resumed with another log cadence keeps its digest and a branch's record of it stays true."""
    flat = experiment.flatten({k: v for k, v in config_json.items() if k not in _NOT_DIGESTED})
    kept = {k: v for k, v in flat.items() if not experiment.passes(k)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:12]


def config_digest(workdir: str) -> str:
    """`digest` of the run's DIR/config.json; a UserError when there is none."""
    config_json = _config_json(workdir)
    if config_json is None:
        raise UserError(f"{Workdir(workdir).config_json} does not exist: {workdir} is not a run's directory")
    return digest(config_json)


def read(workdir: str) -> list[dict]:
    """The run's ancestors, root first ([] for a run that is no branch, or a folder without config.json)."""
    return list((_config_json(workdir) or {}).get(KEY) or [])


def averaged_from(workdir: str) -> list[dict]:
    """The checkpoints an averaged run was made from ([] for any other run)."""
    return list((_config_json(workdir) or {}).get(AVERAGED_KEY) or [])


def of_branch(parent_workdir: str, step: int) -> list[dict]:
    """The lineage a branch of `parent_workdir` at `step` records: the parent's own, then the parent at `step`."""
    entry = {"workdir": str(parent_workdir), "step": int(step), "config_digest": config_digest(parent_workdir)}
    return read(parent_workdir) + [entry]


def root(workdir: str) -> str:
    """The workdir of the run the lineage starts from (`workdir` itself for a run that is no branch)."""
    lineage = read(workdir)
    return lineage[0]["workdir"] if lineage else str(workdir)


def describe(lineage: list[dict], workdir: str) -> str:
    """"runs/stable@100 > runs/ctx@300 > runs/decay": each ancestor at the step branched from, root first."""
    return " > ".join([f"{e['workdir']}@{e['step']}" for e in lineage] + [str(workdir)])


def describe_averaged(sources: list[dict]) -> str:
    """"runs/decay_a@400 ×0.5 + runs/decay_b@400:ema ×0.5": an averaged run's sources and weights."""
    return " + ".join(f"{s['workdir']}@{s['step']}{':ema' if s.get('ema') else ''} ×{s.get('weight', 1.0):g}"
                      for s in sources)


def provenance(workdir: str, name: str | None = None) -> dict[str, str]:
    """{"lineage": describe(...), "averaged_from": describe_averaged(...)}, each where the run has it ({} for a run
    with neither record); `name`: how the run itself is shown last in the lineage (default: its workdir)."""
    out = {}
    if ancestors := read(workdir):
        out[KEY] = describe(ancestors, name or workdir)
    if sources := averaged_from(workdir):
        out[AVERAGED_KEY] = describe_averaged(sources)
    return out


def lines(workdir: str) -> list[str]:
    """What a reader of one run prints about where it came from ([] for a run with neither record)."""
    said = {KEY: "lineage", AVERAGED_KEY: "averaged from"}
    return [f"{said[key]}: {text}" for key, text in provenance(workdir).items()]


def run_name(workdir: str) -> str:
    """The name a run goes by in wandb: its config's `logging.wandb_run_name`, else its folder's name."""
    config_json = _config_json(workdir) or {}
    name = (config_json.get("logging") or {}).get("wandb_run_name")
    return name or str(workdir).rstrip("/").rsplit("/", 1)[-1]


def wandb_group(workdir: str) -> str | None:
    """The wandb group of a branch: its root run's name, so a run and every branch of it sit together; None for a
    run that is no branch."""
    lineage = read(workdir)
    return run_name(lineage[0]["workdir"]) if lineage else None
