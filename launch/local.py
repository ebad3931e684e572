"""N processes of one command on this machine, joined by `jax.distributed` on 127.0.0.1 (`bert-jax local`).

Each process gets `devices_per_process` simulated CPU devices and the overrides
`--config.distributed.{coordinator_address,num_processes,process_id}` appended to the
command; their output is streamed with a `[pI]` prefix. The exit status is non-zero
if any process fails; once one has failed, the rest get `--grace_s` to stop on their
own (jax.distributed's heartbeat) before they are killed. This is how multi-host code
is exercised without a cluster (tests/test_multihost.py).
"""
import os
import runpy
import socket
import subprocess
import sys
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_commands(command: list[str], num_processes: int, port: int) -> list[list[str]]:
    """The command of each process: the given one plus its distributed overrides."""
    return [
        command + [
            f"--config.distributed.coordinator_address=127.0.0.1:{port}",
            f"--config.distributed.num_processes={num_processes}",
            f"--config.distributed.process_id={i}",
        ]
        for i in range(num_processes)
    ]


def process_env(devices_per_process: int, base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    env["JAX_PLATFORMS"] = "cpu"
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={devices_per_process}"])
    return env


def _stream(proc: subprocess.Popen, prefix: str, out) -> None:
    for line in proc.stdout:
        out.write(f"{prefix}{line}")
        out.flush()


def run_local(command: list[str], num_processes: int, devices_per_process: int = 1,
              port: int = 0, grace_s: float = 60.0, timeout_s: float | None = None, out=None) -> int:
    """Runs the processes to completion; returns 0, or the first non-zero exit status."""
    out = sys.stdout if out is None else out
    port = port or free_port()
    env = process_env(devices_per_process)
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for cmd in process_commands(command, num_processes, port)
    ]
    streams = [threading.Thread(target=_stream, args=(p, f"[p{i}] ", out), daemon=True) for i, p in enumerate(procs)]
    for t in streams:
        t.start()
    start, failed_at, status = time.monotonic(), None, 0
    while any(p.poll() is None for p in procs):
        codes = [p.poll() for p in procs]
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = time.monotonic()
            status = next(c for c in codes if c not in (None, 0))
        late = failed_at is not None and time.monotonic() - failed_at > grace_s
        if late or (timeout_s is not None and time.monotonic() - start > timeout_s):
            for i, p in enumerate(procs):
                if p.poll() is None:
                    out.write(f"[launch.local] killing p{i}: {'timeout' if not late else 'a peer failed'}\n")
                    p.kill()
            status = status or 124
        time.sleep(0.2)
    for t in streams:
        t.join()
    codes = [p.returncode for p in procs]
    return status or next((c for c in codes if c != 0), 0)


if __name__ == "__main__":  # `python -m launch.local` from the repository root: the `bert-jax local` command
    runpy.run_module("bert_jax.commands.local", run_name="__main__", alter_sys=True)
