"""A pre-training (or fine-tuning) run on spot TPUs that relaunches itself until it is done, through Ray
(`bert-jax ray-tpu`, also `python -m launch.ray_tpu`).

It reserves a slice (Ray's TPU resources: the `TPU-<type>-head` resource of a slice's
host 0, then one task per host pinned by the slice's name resource), starts one `pretrain`
per host with the `jax.distributed` coordinates of host 0, streams host 0's output, and
waits. What ended the attempt decides what follows (launch/attempts.py): DONE finishes;
a preemption (a host vanished, a process killed by a signal, or every process saved and
exited 0 after a SIGTERM) waits for capacity and relaunches, and the run resumes from the
newest checkpoint in the bucket; a crash (a non-zero exit: a traceback, a config error, a
NaN stop) stops, unless `--max_failures` allows another try and the run got further.
Every attempt goes to `WORKDIR/attempts.jsonl` and is printed at the end.

`--command=bert_jax.finetune` runs a fine-tuning the same way (a sweep of fine-tunings, one run of an
`evaluate --executor=ray` battery): the same harness, the same DONE, the same relaunches.

`bert-jax tpu-vm` (launch/tpu_vm.py) is the way without Ray; it does not relaunch.
"""
from __future__ import annotations

import collections
import ctypes
import os
import runpy
import signal
import socket
import subprocess
import time

from bert_jax import UserError
from bert_jax.parallel import tpu_slices
from bert_jax.storage import paths
from bert_jax.storage.workdir import Workdir
from bert_jax.run import completion
from bert_jax.run import lease as lease_lib
from bert_jax.launch import attempts as attempts_lib
from bert_jax.launch import wandb_env

CONNECT_TIMEOUT_S = 15.0
COMMANDS = ("bert_jax.commands.pretrain", "bert_jax.finetune")  # what a host runs: the modules of the one harness
# After one host fails by itself, the others get this long to notice (jax.distributed) before they are stopped.
GRACE_S = 60.0


class LaunchError(RuntimeError):
    """A slice that cannot run the job (its head has no TPU name)."""


def slice_hosts(tpu: str) -> int:
    """Hosts (TPU VMs) of a slice: 4 chips per host, except the single-host v5e/v6e slices of up to 8."""
    s = tpu_slices.parse_slice(tpu)
    single_host = 8 if s.chip.generation in ("v5e", "v6e") else 4
    return 1 if s.num_chips <= single_host else s.num_chips // 4


def head_resource(tpu: str) -> str:
    """The resource Ray gives host 0 of each `tpu` slice (ray.util.tpu: TPU-<pod type>-head)."""
    return f"TPU-{tpu}-head"


def check_address(address: str) -> None:
    """A Ray address that does not answer fails within CONNECT_TIMEOUT_S, naming it."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as error:
        raise UserError(f"--address={address}: no Ray cluster answers there ({error}). Start one with "
                        f"`ray up launch/ray_tpu_cluster.yaml` (or `ray start --head`) and give its HEAD_IP:6379."
                        ) from None


def check_workdir(workdir: str, hosts: int) -> None:
    if hosts > 1 and not paths.is_remote(workdir):
        raise UserError(f"--workdir={workdir!r} is a local path, and a {hosts}-host slice has {hosts} disks: "
                        f"a relaunch on other hosts would lose the run. Give a gs:// or s3:// workdir.")


def _die_with_parent() -> None:
    """In the pretrain child: die when the Ray worker that started it dies (a cancelled or lost task)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _slice_head() -> tuple[str, str, int]:
    """On host 0 of a free slice: (its IP, the slice's name resource, a free port for the coordinator)."""
    import ray.util.tpu  # noqa: PLC0415 (in the Ray worker)

    name = ray.util.tpu.get_current_pod_name()
    if not name:
        raise LaunchError("the node holding the slice's head resource has no TPU name (TPU_NAME)")
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), name, port


def _run_host(index: int, command: list[str], cwd: str, echo: bool, env: dict | None = None) -> tuple[int, str]:
    """One host's pretrain: (exit status, the last lines of its output). Host 0's output is printed (Ray
    forwards it to the launcher). `env` is added to the worker's environment (the launcher's WANDB_*)."""
    proc = subprocess.Popen(command, cwd=cwd or None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_die_with_parent, env={**os.environ, **(env or {})})
    tail = collections.deque(maxlen=40)
    for line in proc.stdout:
        tail.append(line)
        if echo:
            print(f"[host {index}] {line}", end="", flush=True)
    return proc.wait(), "".join(tail)


def host_commands(args, coordinator: str, hosts: int, relaunch: bool) -> list[list[str]]:
    base = [args.python, "-m", args.command, f"--config={args.config}", f"--workdir={args.workdir}",
            *args.overrides]
    if relaunch:  # the lease of a vanished host 0 goes stale after its timeout: wait for it rather than fail
        base.append(f"--config.lease.wait_s={lease_lib.default_config().timeout_s + 30:.0f}")
    return [base + [f"--config.distributed.coordinator_address={coordinator}",
                    f"--config.distributed.num_processes={hosts}", f"--config.distributed.process_id={i}"]
            for i in range(hosts)]


def step_reached(workdir: str) -> int:
    steps = Workdir(workdir).checkpoint_steps()
    return steps[-1] if steps else 0


def reserve_slice(ray, args, deadline: float):
    """(coordinator address, slice name) of a free slice, or None if none came before `deadline`."""
    head = head_resource(args.tpu)
    if head not in ray.cluster_resources():
        print(f"[launch.ray_tpu] no {head} in the cluster now; waiting up to {deadline - time.time():.0f} s "
              f"(--max_wait) for one. Cluster resources: {dict(ray.cluster_resources())}", flush=True)
    ref = ray.remote(_slice_head).options(num_cpus=0, resources={head: 1}, max_retries=0).remote()
    ready, _ = ray.wait([ref], timeout=max(0.0, deadline - time.time()))
    if not ready:
        ray.cancel(ref, force=True)
        return None
    ip, name, port = ray.get(ref)
    return f"{ip}:{port}", name


def run_attempt(ray, args, hosts: int, coordinator: str, name: str, relaunch: bool) -> tuple[list, str]:
    """Starts and waits for one pretrain per host: (exit codes, reason a host was lost or "")."""
    run_host = ray.remote(_run_host)
    refs = [run_host.options(num_cpus=0, resources={name: 1}, max_retries=0).remote(i, cmd, args.repo, i == 0, wandb_env())
            for i, cmd in enumerate(host_commands(args, coordinator, hosts, relaunch))]
    codes: list = [None] * hosts
    lost, failed_at = "", None
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        for ref in done:
            i = refs.index(ref)
            try:
                codes[i], tail = ray.get(ref)
                if codes[i] != 0:
                    print(f"[launch.ray_tpu] host {i} exited with status {codes[i]}; its last output:\n{tail}",
                          flush=True)
                    failed_at = failed_at or time.time()
            except ray.exceptions.RayError as error:
                lost = lost or f"host {i} was lost ({type(error).__name__})"
                print(f"[launch.ray_tpu] {lost}: {str(error).splitlines()[0][:300]}", flush=True)
        if pending and (lost or (failed_at and time.time() - failed_at > GRACE_S)):
            for ref in pending:
                ray.cancel(ref, force=True)
            ray.wait(pending, num_returns=len(pending), timeout=30)
            break
    return codes, lost


def launch(args) -> int:
    import ray  # noqa: PLC0415 (the `ray` extra)

    hosts = args.num_hosts or slice_hosts(args.tpu)
    check_workdir(args.workdir, hosts)
    finished = completion.read_done(args.workdir)
    if finished:
        print(f"[launch.ray_tpu] {args.workdir} already holds a finished run (DONE: step {finished['step']} of "
              f"{finished['last_step']}); nothing to launch.", flush=True)
        return 0
    check_address(args.address)
    ray.init(address=args.address, log_to_driver=True, logging_level="WARNING")
    history = attempts_lib.read_attempts(args.workdir)
    this_launch = []
    while True:
        started = time.time()
        reserved = reserve_slice(ray, args, started + args.max_wait)
        if reserved is None:
            outcome, reason = "no_capacity", (f"no {head_resource(args.tpu)} within --max_wait={args.max_wait:.0f} s; "
                                              f"cluster resources: {dict(ray.cluster_resources())}")
        else:
            coordinator, name = reserved
            print(f"[launch.ray_tpu] attempt {len(history) + 1}: slice {name}, {hosts} hosts, coordinator "
                  f"{coordinator}", flush=True)
            codes, lost = run_attempt(ray, args, hosts, coordinator, name, relaunch=bool(this_launch))
            outcome, reason = attempts_lib.classify(codes, lost, completion.read_done(args.workdir) is not None)
        attempt = attempts_lib.Attempt(len(history) + 1, started, time.time(), outcome, step_reached(args.workdir),
                                       reason)
        history.append(attempt)
        this_launch.append(attempt)
        attempts_lib.write_attempts(args.workdir, history)
        again, why = attempts_lib.decide(this_launch, args.max_preemptions, args.max_failures)
        print(f"[launch.ray_tpu] {attempt.line()}; {why}", flush=True)
        if not again:
            break
    print("[launch.ray_tpu] attempts:\n" + "\n".join("  " + a.line() for a in history), flush=True)
    return 0 if history[-1].outcome == "done" else 1


if __name__ == "__main__":  # `python -m launch.ray_tpu` from the repository root: the `bert-jax ray-tpu` command
    runpy.run_module("bert_jax.commands.ray_tpu", run_name="__main__", alter_sys=True)
