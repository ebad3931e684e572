"""A real local Ray cluster on 127.0.0.1 standing in for a TPU slice: a head and one node per "host".

Each node is its own `ray start --block` process tree, so a test can make a host vanish
(SIGKILL to its raylet, workers and their children) and start a fresh one. A node of
the fake 2-host slice `v4-16` advertises what Ray gives a TPU VM: the slice's name as a
resource on every host (`TPU_NAME`, read by ray.util.tpu) and `TPU-v4-16-head` on host 0.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil

RAY = os.path.join(os.path.dirname(sys.executable), "ray")
SLICE = "fake-slice"
TPU = "v4-16"  # 8 chips: 2 hosts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRayCluster:
    def __init__(self, temp_dir: str, env: dict):
        self.port, self.temp_dir, self.env = free_port(), temp_dir, env
        self.address = f"127.0.0.1:{self.port}"
        self.head = self._start(["--head", f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false",
                                 f"--temp-dir={temp_dir}"], {})
        self._wait_nodes(1)
        self.hosts: list[subprocess.Popen] = []

    def _start(self, flags: list[str], extra_env: dict) -> subprocess.Popen:
        return subprocess.Popen([RAY, "start", "--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
                                 *flags], env={**self.env, **extra_env}, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _alive_nodes(self) -> int:
        out = subprocess.run([sys.executable, "-c", (
            "import ray, json; ray.init(address=%r, logging_level='ERROR'); "
            "print(json.dumps(sum(n['Alive'] for n in ray.nodes())))") % self.address],
            capture_output=True, text=True, timeout=60, env=self.env)
        return json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else 0

    def _wait_nodes(self, count: int, timeout_s: float = 90) -> None:
        deadline = time.time() + timeout_s
        while self._alive_nodes() < count:
            if time.time() > deadline:
                raise TimeoutError(f"the local Ray cluster did not reach {count} live nodes in {timeout_s} s")
            time.sleep(1)

    def add_host(self, head: bool) -> subprocess.Popen:
        resources = {SLICE: 1, **({f"TPU-{TPU}-head": 1} if head else {})}
        node = self._start([f"--address={self.address}", "--num-cpus=1", f"--resources={json.dumps(resources)}"],
                           {"TPU_NAME": SLICE})
        self.hosts.append(node)
        return node

    def start_slice(self) -> None:
        for head in (True, False):  # one at a time: two nodes starting together can collide
            alive = self._alive_nodes()
            self.add_host(head=head)
            self._wait_nodes(alive + 1)

    @staticmethod
    def kill(node: subprocess.Popen) -> None:
        """The host vanishes: SIGKILL to the node's whole tree (raylet, workers, the processes they started)."""
        tree = [node, *psutil.Process(node.pid).children(recursive=True)]
        for p in tree:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        node.wait(timeout=30)

    def close(self) -> None:
        for node in [*self.hosts, self.head]:
            if node.poll() is None:
                self.kill(node)
