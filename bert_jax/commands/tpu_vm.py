"""Creates Cloud TPU VMs and runs pre-training on every worker.

    bert-jax tpu-vm all --name=bert-large --zone=us-central2-b --accelerator_type=v4-32 \\
        --spot --config=configs/bert_large.py --workdir=gs://BUCKET/bert_large \\
        -- --config.mesh.shape='(1,-1,1)'

Actions: create | setup | run | logs | delete | all (create, setup, run). Everything after -- is passed to pretrain:
--config.key=value overrides. `--dry_run` prints the exact commands instead of running them.
"""
import shlex
import subprocess

from bert_jax import UserError
from bert_jax.launch import shown, tpu_vm, wandb_env
from bert_jax.run import argparse_command


def parser() -> argparse_command.ArgumentParser:
    p = argparse_command.parser(__file__, description=__doc__, epilog=tpu_vm.__doc__)
    p.add_argument("action", choices=tpu_vm.ACTIONS, help="(no relaunch after a preemption: see `bert-jax ray-tpu`)")
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
    return p


def parse_args(argv: list[str]):
    """The flags, and in `.overrides` the pretrain overrides after `--`."""
    return parser().parse_with_overrides(argv)


def _main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.action in ("run", "all") and not args.workdir.startswith(("gs://", "s3://")):
        # A local path would be a different disk on every worker, and gone with a preempted VM.
        raise UserError(f"--workdir={args.workdir!r}: give a gs:// path (all workers share it, and it outlives the "
                        f"VM), e.g. --workdir=gs://BUCKET/runs/NAME")
    for cmd in tpu_vm.commands(args.action, args):
        print(shown(shlex.join(cmd), wandb_env()), flush=True)  # an API key is passed, never printed
        if not args.dry_run:
            subprocess.run(cmd, check=True)
    if args.action == "all" and args.delete_when_done:
        print(f"# waiting for {args.workdir}/DONE, then: {shlex.join(tpu_vm.commands('delete', args)[0])}", flush=True)
        if not args.dry_run:
            tpu_vm.wait_then_delete(args)


def main(argv=None) -> None:
    argparse_command.run(__file__, _main, argv)


if __name__ == "__main__":
    main()
