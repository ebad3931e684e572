"""Cloud TPU VMs through `gcloud` (`bert-jax tpu-vm`): create, set up, run on every worker, stream logs, delete.

A pod slice has one worker (host) per 4 chips on v4 (v4-32: 16 chips, 4
workers); the same command runs on every worker (`--worker=all`) and `jax.distributed`
finds its peers from the TPU VM's metadata, so no coordinator is given. `--queued` asks for the slice through queued
resources (the way to get spot capacity that is not free right now).

`all --delete_when_done` then waits for the run's DONE in the workdir (polling every
`--poll_s`) and deletes the slice, so a finished run stops billing (what `bert-jax sweep
run --executor=tpu` prints per point).

It does not relaunch: a preempted slice's run stays stopped (its checkpoint saved) until
someone runs `run` again. For runs that relaunch themselves until done, use
`bert-jax ray-tpu` on a Ray cluster (docs/guides/tpu.md: "Spot TPUs that finish by themselves").
"""
import runpy
import shlex
import subprocess
import time

from bert_jax.launch import wandb_env
from bert_jax.run import completion

ACTIONS = ("create", "setup", "run", "logs", "delete", "all")
REMOTE_DIR = "bert_jax"
LOG = "pretrain.log"


def _gcloud(args, *rest: str) -> list[str]:
    cmd = ["gcloud", "compute", "tpus", *rest, f"--zone={args.zone}"]
    return cmd + ([f"--project={args.project}"] if args.project else [])


def _ssh(args, remote: str, worker: str = "all") -> list[str]:
    return _gcloud(args, "tpu-vm", "ssh", args.name) + [f"--worker={worker}", f"--command={remote}"]


def pretrain_command(config: str, workdir: str, overrides: list[str], env: dict | None = None) -> str:
    """The pretrain command line, prefixed with `env` (the launching shell's WANDB_*, so every worker logs)."""
    prefix = [f"{k}={v}" for k, v in sorted((env or {}).items())]
    return shlex.join([*(["env", *prefix] if prefix else []), "python3", "-m", "bert_jax.commands.pretrain", f"--config={config}",
                       f"--workdir={workdir}", *overrides])


def commands(action: str, args) -> list[list[str]]:
    """The gcloud invocations of one action, in order."""
    if action == "all":
        return [c for a in ("create", "setup", "run") for c in commands(a, args)]
    if action == "create":
        capacity = ["--spot"] if args.spot else ["--preemptible"] if args.preemptible else []
        if args.queued:
            return [_gcloud(args, "queued-resources", "create", args.name) + [
                f"--node-id={args.name}", f"--accelerator-type={args.accelerator_type}",
                f"--runtime-version={args.version}", *capacity]]
        return [_gcloud(args, "tpu-vm", "create", args.name) + [
            f"--accelerator-type={args.accelerator_type}", f"--version={args.version}", *capacity]]
    if action == "setup":
        setup = (f"rm -rf {REMOTE_DIR} && git clone --depth=1 --branch={args.branch} {args.repo_url} {REMOTE_DIR} && "
                 f"cd {REMOTE_DIR} && pip install -U pip && pip install -e . 'jax[tpu]>=0.10,<0.11'")
        return [_ssh(args, setup)]
    if action == "run":
        run = (f"cd {REMOTE_DIR} && nohup {pretrain_command(args.config, args.workdir, args.overrides, wandb_env())} "
               f"> {LOG} 2>&1 &")
        return [_ssh(args, run)]
    if action == "logs":
        return [_ssh(args, f"tail -n 100 -f {REMOTE_DIR}/{LOG}", worker="0")]
    if action == "delete":
        if args.queued:
            return [_gcloud(args, "queued-resources", "delete", args.name) + ["--force", "--quiet"]]
        return [_gcloud(args, "tpu-vm", "delete", args.name) + ["--quiet"]]
    raise ValueError(f"unknown action {action!r}; expected one of {ACTIONS}")


def wait_then_delete(args) -> None:
    """Polls the workdir's DONE (bert_jax/run/completion.py) and deletes the slice once it is there."""
    while completion.read_done(args.workdir) is None:
        time.sleep(args.poll_s)
    for cmd in commands("delete", args):
        print(shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True)


if __name__ == "__main__":  # `python -m launch.tpu_vm` from the repository root: the `bert-jax tpu-vm` command
    runpy.run_module("bert_jax.commands.tpu_vm", run_name="__main__", alter_sys=True)
