"""Cloud TPU VMs through `gcloud`: create, set up, run on every worker, stream logs, delete.

    python -m launch.tpu_vm all --name=bert-large --zone=us-central2-b --accelerator_type=v4-32 \
        --spot --config=configs/bert_large.py --workdir=gs://BUCKET/bert_large \
        -- --config.mesh.shape='(1,-1,1)'

Actions: create | setup | run | logs | delete | all (create, setup, run). `--dry_run`
prints the exact commands instead of running them. A pod slice has one worker (host)
per 4 chips on v4 (v4-32: 16 chips, 4 workers); the same command runs on every
worker (`--worker=all`) and `jax.distributed` finds its peers from the TPU VM's
metadata, so no coordinator is given. `--queued` asks for the slice through queued
resources (the way to get spot capacity that is not free right now).

`all --delete_when_done` then waits for the run's DONE in the workdir (polling every
`--poll_s`) and deletes the slice, so a finished run stops billing (what `launch.sweep
--executor=tpu` prints per point).

It does not relaunch: a preempted slice's run stays stopped (its checkpoint saved) until
someone runs `run` again. For runs that relaunch themselves until done, use
`python -m launch.ray_tpu` on a Ray cluster (docs/guides/tpu.md: "Spot TPUs that finish by themselves").
"""
import argparse
import shlex
import subprocess
import sys
import time

from bert_jax.run import completion

from launch import parse_with_overrides, shown, wandb_env

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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=ACTIONS, help="(no relaunch after a preemption: see launch.ray_tpu)")
    p.add_argument("--name", required=True, help="TPU VM (and queued resource) name")
    p.add_argument("--zone", required=True)
    p.add_argument("--project", default="")
    p.add_argument("--accelerator_type", default="v4-32")
    p.add_argument("--version", default="tpu-ubuntu2204-base", help="TPU VM runtime version")
    capacity = p.add_mutually_exclusive_group()
    capacity.add_argument("--spot", action="store_true")
    capacity.add_argument("--preemptible", action="store_true")
    p.add_argument("--queued", action="store_true", help="create through queued-resources")
    p.add_argument("--repo_url", default="https://github.com/OWNER/bert_jax.git")
    p.add_argument("--branch", default="main")
    p.add_argument("--config", default="configs/bert_base.py")
    p.add_argument("--workdir", default="", help="a gs:// path: every worker must see the same workdir")
    p.add_argument("--dry_run", action="store_true", help="print the commands instead of running them")
    p.add_argument("--delete_when_done", action="store_true",
                   help="all: wait for the run's DONE in --workdir, then delete the slice")
    p.add_argument("--poll_s", type=float, default=300.0, help="--delete_when_done: seconds between looks at DONE")
    p.epilog = "Everything after -- is passed to pretrain: --config.key=value overrides."
    return p


def parse_args(argv: list[str]):
    return parse_with_overrides(parser(), argv)


def main(argv=None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.action in ("run", "all") and not args.workdir.startswith(("gs://", "s3://")):
        # A local path would be a different disk on every worker, and gone with a preempted VM.
        sys.exit(f"launch.tpu_vm: --workdir={args.workdir!r}: give a gs:// path (all workers share it, and it "
                 f"outlives the VM), e.g. --workdir=gs://BUCKET/runs/NAME")
    for cmd in commands(args.action, args):
        print(shown(shlex.join(cmd), wandb_env()), flush=True)  # an API key is passed, never printed
        if not args.dry_run:
            subprocess.run(cmd, check=True)
    if args.action == "all" and args.delete_when_done:
        print(f"# waiting for {args.workdir}/DONE, then: {shlex.join(commands('delete', args)[0])}", flush=True)
        if not args.dry_run:
            wait_then_delete(args)


def wait_then_delete(args) -> None:
    """Polls the workdir's DONE (bert_jax/run/completion.py) and deletes the slice once it is there."""
    while completion.read_done(args.workdir) is None:
        time.sleep(args.poll_s)
    for cmd in commands("delete", args):
        print(shlex.join(cmd), flush=True)
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
