"""What a run was a function of, recorded in DIR/config.json, and the check a resume makes.

A run's losses depend on its config, its seed, its tokenizer, its data and its code. The
config is config.json itself; `run_identity` adds the rest under the key IDENTITY_KEY:

    tokenizer_sha256   bert_jax.commands.tokenizer.tokenizer_hash of DIR/tokenizer
    data               data_fingerprint: the source and what it reads (files with sizes, mtimes
                       and object generations; a prepared manifest's hash; the embedded corpus's
                       hash and the interpreter that made it)
    packages           versions of the libraries the numbers depend on
    git_commit         the code's commit, and whether the tree had uncommitted changes

On resume, `check_resume` compares the recorded identity with today's: a changed tokenizer or
data fingerprint stops the run before its first step, naming what changed, unless
config.allow_data_change is set (then it logs what changed and goes on). Other packages or
another commit are logged, not stopped for: resuming on upgraded code is normal.
"""
from __future__ import annotations

import importlib.metadata
import json
import pathlib
import subprocess

from absl import logging

from bert_jax import UserError
from bert_jax.storage.workdir import Workdir
from data_pipelines.sources import documents as sources, mixture
from data_pipelines.tokenizers import tokenizer as tokenizer_lib

IDENTITY_KEY = "run_identity"
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "numpy", "tokenizers", "sentencepiece")


class DataChangedError(UserError, RuntimeError):
    pass


def run_identity(data_cfg, tokenizer_dir: str) -> dict:
    return {
        "tokenizer_sha256": tokenizer_lib.tokenizer_hash(tokenizer_dir),
        "data": data_fingerprint(data_cfg),
        "packages": package_versions(),
        "git_commit": git_commit(),
    }


def data_fingerprint(data_cfg) -> dict:
    """What identifies the data a source reads, without reading it all.

    Files are identified by size, mtime and (in a bucket) object generation or ETag, not by
    content: hashing a terabyte corpus at every start costs too much. So touching a file
    counts as a change; pass config.allow_data_change=True to go on.
    """
    if mixture.has_mixture(data_cfg):  # each source's own, by name
        return {"mixture": {name: data_fingerprint(cfg) for name, cfg in mixture.source_configs(data_cfg).items()}}
    return sources.source_of(data_cfg).fingerprint()


def package_versions() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> dict | None:
    """The code's commit and whether tracked files had changes; None outside a git checkout."""
    code_dir = pathlib.Path(__file__).resolve().parents[2]  # code, never a user path

    def git(*args) -> str:
        return subprocess.run(["git", "-C", str(code_dir), *args], capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError):
        return None


def previous_identity(workdir: str) -> dict | None:
    """The identity recorded in DIR/config.json by an earlier start of this run, if any."""
    path = Workdir(workdir).config_json
    if not path.exists():
        return None
    return json.loads(path.read_text()).get(IDENTITY_KEY)


def check_resume(previous: dict | None, current: dict, workdir: str, allow_data_change: bool) -> None:
    """Stops (DataChangedError) when the tokenizer or the data changed since the run last started."""
    if previous is None:
        return
    changes = []
    if previous.get("tokenizer_sha256") != current["tokenizer_sha256"]:
        changes.append(f"the tokenizer in {Workdir(workdir).tokenizer} changed (sha256 {previous.get('tokenizer_sha256')} "
                       f"-> {current['tokenizer_sha256']})")
    if previous.get("data") != current["data"]:
        changes.extend(_data_changes(previous.get("data") or {}, current["data"]))
    for key in ("packages", "git_commit"):
        if previous.get(key) != current[key]:
            logging.warning("resuming with other %s than the run started with: %s -> %s", key, previous.get(key),
                            current[key])
    if not changes:
        return
    if allow_data_change:
        for change in changes:
            logging.warning("config.allow_data_change=True: going on although %s", change)
        return
    raise DataChangedError(
        f"{workdir} was started on other data than it resumes on, so its losses would not continue the "
        f"same run: {'; '.join(changes)}. Restore the data, start a new workdir, or pass "
        "--config.allow_data_change=True to go on anyway."
    )


def _data_changes(before: dict, after: dict) -> list[str]:
    """Each difference between two data fingerprints, naming the file (or key) that differs."""
    old_files = {f["path"]: f for f in before.get("files", [])}
    new_files = {f["path"]: f for f in after.get("files", [])}
    changes = [f"data file {p} was removed" for p in old_files if p not in new_files]
    changes += [f"data file {p} was added" for p in new_files if p not in old_files]
    for path in old_files.keys() & new_files.keys():
        if old_files[path] != new_files[path]:
            what = ", ".join(f"{k} {old_files[path].get(k)} -> {new_files[path].get(k)}"
                             for k in ("size", "mtime", "generation") if old_files[path].get(k) != new_files[path].get(k))
            changes.append(f"data file {path} changed ({what})")
    for key in sorted((before.keys() | after.keys()) - {"files"}):
        if before.get(key) != after.get(key):
            changes.append(f"data {key} changed ({before.get(key)!r} -> {after.get(key)!r})")
    return sorted(changes)
