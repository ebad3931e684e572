"""How a set of runs gets run: here, `parallel` at a time, or each as a `ray-tpu` job on a Ray cluster of
TPU slices. One mechanism for the sweep's points (launch/sweep.py) and a battery's fine-tunings
(`bert-jax evaluate --executor=ray`, bert_jax/finetune/battery.py).

    local  every run is a command here, `parallel` at once, each one's output in LOG_DIR/<name>.log when more
           than one runs at a time
    ray    every run is `bert-jax ray-tpu --command=<module> ...`, all submitted at once: each waits for a
           free slice and is relaunched after preemptions until its DONE, so as many run at once as the cluster
           has slices

A run is the module it runs (bert_jax.commands.pretrain or bert_jax.finetune), a config file, a workdir and overrides.
"""
import concurrent.futures
import shlex
import subprocess
import sys

from bert_jax import UserError
from bert_jax.registry import Registry, registered_as
from bert_jax.storage import paths
from bert_jax.launch import ray_tpu

ROOT = str(paths.path(__file__).resolve().parent.parent)  # the project: what a Ray host runs its commands in
BATTERY_RUN_CONFIG = "configs/suites/battery_run.py"  # a battery's run as a config file (OUT,TASK)


def format_value(value) -> str:
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(format_value(v) for v in value) + ")"
    return str(value)


def override_flags(overrides: dict) -> list[str]:
    return [f"--config.{key}={format_value(value)}" for key, value in overrides.items()]


def add_ray_flags(parser) -> None:
    """The flags of the `ray` executor, for every command that offers it."""
    parser.add_argument("--address", default="", help="ray: the cluster's HEAD_IP:PORT")
    parser.add_argument("--tpu", default="v4-8", help="ray: the slice type each run gets")
    parser.add_argument("--max_wait", type=float, default=86400.0, help="ray: seconds a run waits for a free slice")
    parser.add_argument("--python", default="python3", help="ray: the interpreter on the hosts")


def check_ray(args, shared_dir: str, flag: str) -> None:
    """`--executor=ray` needs a cluster address, and a bucket for the runs unless each slice is one host (then the
    hosts may share a disk, as on a test machine)."""
    if not args.address:
        raise UserError("--executor=ray needs --address (the Ray cluster's HEAD_IP:PORT)")
    if not paths.is_remote(shared_dir) and ray_tpu.slice_hosts(args.tpu) != 1:
        # Every slice's hosts must see the same workdirs, and they outlive the slices.
        raise UserError(f"--executor=ray: give a gs:// or s3:// {flag}, not {shared_dir!r}")


def ray_argv(args, command: str, config: str, workdir: str, overrides: dict, repo: str = "") -> list[str]:
    """A run as a `ray-tpu` job: it waits for a free slice and is relaunched until its DONE."""
    return [sys.executable, "-m", "bert_jax.commands.ray_tpu", f"--address={args.address}", f"--tpu={args.tpu}",
            f"--command={command}", f"--config={config}", f"--workdir={workdir}", f"--max_wait={args.max_wait}",
            f"--python={args.python}", *([f"--repo={repo}"] if repo else []), "--", *override_flags(overrides)]


def run_commands(named_argvs: list[tuple[str, list[str]]], parallel: int, log_dir) -> list[str]:
    """Runs every (name, argv), `parallel` at once; returns the names that failed. With more than one at a
    time each one's output goes to log_dir/<name>.log (a local folder), else to this terminal."""
    def run_one(index: int, name: str, argv: list[str]) -> bool:
        print(f"[run] {index + 1}/{len(named_argvs)} {name}: {shlex.join(argv)}", flush=True)
        if parallel == 1:
            return subprocess.run(argv).returncode == 0
        log_dir.mkdir(parents=True, exist_ok=True)
        with (log_dir / f"{name}.log").open("w") as log:
            ok = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT).returncode == 0
        print(f"[run] {name}: {'finished' if ok else 'FAILED'} (log: {log_dir / f'{name}.log'})", flush=True)
        return ok

    with concurrent.futures.ThreadPoolExecutor(max(1, parallel)) as pool:
        done = list(pool.map(lambda item: run_one(item[0], *item[1]), enumerate(named_argvs)))
    return [name for (name, _), ok in zip(named_argvs, done) if not ok]


def ray_battery(args, out: str):
    """A battery's executor (bert_jax/finetune/battery.py's `run_battery`): each job of a wave a
    `ray-tpu --command=bert_jax.finetune` job, all at once; a job that does not finish fails the battery,
    naming its log."""
    # A bucket's OUT keeps no logs (no append): they go beside the command, in battery_logs/<OUT's name>.
    remote = paths.is_remote(out)
    log_dir = paths.path("battery_logs") / paths.path(out).name if remote else paths.path(out) / "logs"

    def execute(jobs) -> bool:
        named = [(f"{job.run.task},lr={job.run.learning_rate:g},seed={job.run.seed}",
                  ray_argv(args, "bert_jax.finetune", f"{BATTERY_RUN_CONFIG}:{out},{job.run.task}", job.run.workdir,
                           job.overrides, repo=ROOT))
                 for job in jobs]
        failed = run_commands(named, len(named), log_dir)
        if failed:
            raise RuntimeError(f"--executor=ray: {len(failed)} run(s) did not finish: {', '.join(failed)} (their "
                               f"logs: {log_dir}/<run>.log); run the same command again to retry them")
        return True

    return execute


class Executor:
    """What differs between executors, asked by every command that offers --executor (sweep run, evaluate); the
    commands never branch on its name. This one runs each command here."""

    name: str
    flags: tuple[str, ...] = ()  # the command-line flags it reads, which a command passes on to another
    prints_only = False  # it prints the commands for the user to run (sweep's `tpu`) rather than running them

    def check(self, args, shared_dir: str, flag: str) -> None:
        """Refuses, naming the flag, what it cannot run with, before anything starts."""

    def argv(self, args, command: str, config: str, workdir: str, overrides: dict, here: list[str]) -> list[str]:
        """A run's command line: `here` (the command as run on this machine), or a job that runs it elsewhere."""
        del args, command, config, workdir, overrides
        return here

    def parallel(self, args, runs: int) -> int:
        """How many runs at once when --parallel does not say."""
        del runs
        return args.parallel or 1

    def battery(self, args, checkpoint: str, out: str):
        """(checkpoint, out, execute) for bert_jax/finetune/battery.py: execute None runs the jobs in-process."""
        del args
        return checkpoint, out, None


EXECUTORS: Registry[Executor] = Registry("--executor", "executors")


@registered_as(EXECUTORS, "local")
class LocalExecutor(Executor):
    pass


@registered_as(EXECUTORS, "ray")
class RayExecutor(Executor):
    """Every run a `ray-tpu` job on a Ray cluster of TPU slices, all submitted at once."""

    flags = ("address", "tpu", "max_wait", "python")

    def check(self, args, shared_dir: str, flag: str) -> None:
        check_ray(args, shared_dir, flag)

    def argv(self, args, command, config, workdir, overrides, here):
        return ray_argv(args, command, config, workdir, overrides)

    def parallel(self, args, runs: int) -> int:
        return args.parallel or runs  # each job waits for its own slice

    def battery(self, args, checkpoint: str, out: str):
        # The hosts run in the project's directory: local paths are given to them whole.
        checkpoint, out = paths.absolute(checkpoint), paths.absolute(out)
        return checkpoint, out, ray_battery(args, out)


def executor(name: str) -> Executor:
    """The executor --executor names (an instance of its registered class)."""
    return EXECUTORS.get(name)()
