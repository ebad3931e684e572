"""bench/soak.py's storage and faults: the workdirs' store (local disk on a size-limited tmpfs, or a bucket on the
fake-gcs-server or moto (S3) emulator behind a proxy that can refuse), and the faults injected between kills."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

TMPFS_MB = 64


# ------------------------------------------------------------------------------------------------------------------
# Storage: local (on a tmpfs where it can be mounted) or a bucket on the emulator, behind a proxy that can refuse.
# ------------------------------------------------------------------------------------------------------------------

class Storage:
    def __init__(self, kind: str, out: Path):
        from bert_jax.storage import paths  # noqa: PLC0415

        self.kind, self.out, self.paths = kind, out, paths
        self.env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COMPILATION_CACHE_DIR=str(out.parent / "xla_cache"),
                        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", PYTHONUNBUFFERED="1")
        self.tmpfs = None
        self.proxy = None
        if kind == "gs":
            from cloud_emulators import FaultyProxy, make_gcs_bucket, start_fake_gcs  # noqa: PLC0415  (tests/)

            self.server, url = start_fake_gcs(out / "fake-gcs-server.log")
            self.proxy = FaultyProxy(url)
            os.environ.update(STORAGE_EMULATOR_HOST=self.proxy.url, TENSORSTORE_GCS_HTTP_URL=self.proxy.url)
            self.env.update(STORAGE_EMULATOR_HOST=self.proxy.url, TENSORSTORE_GCS_HTTP_URL=self.proxy.url,
                            GOOGLE_AUTH_TOKEN_FOR_TESTING="test")
            self._make_bucket = lambda name: make_gcs_bucket(url, name)
        elif kind == "s3":
            from cloud_emulators import FaultyProxy, make_s3_bucket, s3_env, start_moto  # noqa: PLC0415  (tests/)

            self.server, url = start_moto()
            self.proxy = FaultyProxy(url)
            os.environ.update(s3_env(self.proxy.url))
            self.env.update(s3_env(self.proxy.url))
            self._make_bucket = lambda name: make_s3_bucket(url, name)
        else:
            mount = out / "tmpfs"
            mount.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m", "tmpfs",
                                                     str(mount)], capture_output=True).returncode == 0:
                self.tmpfs = mount
            self.root = mount

    def new_workdir(self, name: str) -> str:
        if self.kind != "local":
            bucket = f"soak-{name}-{random.getrandbits(32):08x}"
            self._make_bucket(bucket)
            return f"{self.kind}://{bucket}/run"
        path = self.root / name
        if path.exists():
            shutil.rmtree(path)
        return str(path)

    def copy_tree(self, src: Path, dst: str) -> None:
        for f in src.rglob("*"):
            if f.is_file():
                self.paths.copy_file(f, self.paths.path(dst) / f.relative_to(src))

    def remove(self, workdir: str) -> None:
        if self.kind == "local":
            shutil.rmtree(workdir, ignore_errors=True)

    def close(self) -> None:
        if self.tmpfs is not None:
            subprocess.run(["umount", "-l", str(self.tmpfs)], check=False)
        if self.proxy is not None:
            self.proxy.close()
            self.server.terminate() if self.kind == "gs" else self.server.stop()

    # What the checkpoint folder shows: committed steps, and whether a save is being written.

    def checkpoint_state(self, workdir: str) -> tuple[list[int], bool]:
        folder = self.paths.fresh(workdir) / "checkpoints"
        try:
            names = [p.name for p in folder.iterdir()]
        except (FileNotFoundError, OSError):
            return [], False
        committed, writing = [], False
        for name in names:
            if "tmp" in name:
                writing = True
            elif name.isdigit():
                if (folder / name / "commit_success.txt").exists() or self.kind == "local":
                    committed.append(int(name))
                else:
                    writing = True  # a bucket's step folder before its commit marker
        return sorted(committed), writing


# ------------------------------------------------------------------------------------------------------------------
# Faults.
# ------------------------------------------------------------------------------------------------------------------

def inject_half_line(storage: Storage, workdir: str) -> None:
    metrics = storage.paths.fresh(workdir) / "metrics.jsonl"
    text = metrics.read_text() if metrics.exists() else ""
    metrics.write_text(text + '{"step": 38, "train/loss": 7.12')  # no newline, no closing brace


def inject_half_checkpoint(storage: Storage, workdir: str) -> str:
    committed, _ = storage.checkpoint_state(workdir)
    state = storage.paths.fresh(workdir) / "checkpoints" / str(committed[-1]) / "state"
    files = list(storage.paths.files_under(state))
    largest = max(files, key=lambda p: len(p.read_bytes()))
    data = largest.read_bytes()
    largest.write_bytes(data[: len(data) // 2])
    return f"{committed[-1]}/{largest.relative_to(state)}"


class Unwritable:
    """The checkpoints folder refuses writes while held."""

    def __init__(self, storage: Storage, workdir: str):
        self.storage, self.folder = storage, Path(workdir) / "checkpoints"
        self.how = ""

    def __enter__(self):
        if self.storage.kind != "local":
            for method in ("POST", "PUT", "DELETE", "PATCH"):
                self.storage.proxy.deny(method, "run/checkpoints/")
            self.how = "proxy 403 on writes under checkpoints/"
        elif os.geteuid() == 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            subprocess.run(["mount", "--bind", str(self.folder), str(self.folder)], check=True)
            subprocess.run(["mount", "-o", "remount,ro,bind", str(self.folder)], check=True)
            self.how = "read-only bind mount"
        else:
            self.folder.chmod(0o555)
            self.how = "chmod 555"
        return self

    def __exit__(self, *exc):
        if self.storage.kind != "local":
            self.storage.proxy.rules.clear()
        elif self.how.startswith("read-only"):
            subprocess.run(["umount", str(self.folder)], check=True)
        else:
            self.folder.chmod(0o755)


def fill_disk(mount: Path) -> Path:
    """Writes a ballast file until the file system is full; returns it (delete it to free the space)."""
    ballast = mount / "ballast"
    chunk = b"\0" * (1 << 20)
    with open(ballast, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return ballast
