"""bench/soak.py at its smallest: 3 SIGKILLs at random moments and one fault, on local disk, then the run's losses
against an uninterrupted run's, bit for bit (the bench's 50-kill figures are in docs/results/soak.md)."""
import errno
import os
import subprocess
import sys

import pytest

from bert_jax.checkpoint.manager import CheckpointSaveError
from bert_jax.run import command_line

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # a reference run and five launches of a pre-training, each paying its start-up
def test_three_kills_and_a_fault_resume_to_the_uninterrupted_losses(tmp_path):
    done = subprocess.run([sys.executable, "bench/soak.py", "--kills=3", "--seed=1", f"--out={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=3000)
    report = done.stdout + done.stderr[-3000:]
    assert done.returncode == 0, report
    assert "3 kills in" in done.stdout and ": 0 differences" in done.stdout, report
    assert "fault half_line" in done.stdout or '"half_line": 1' in done.stdout, report


@pytest.mark.parametrize("error, says", [
    (OSError(errno.ENOSPC, "No space left on device", "/w/metrics.jsonl"), "No space left on device: '/w/metrics.jsonl'"),
    (CheckpointSaveError("saving a checkpoint in /w/checkpoints failed (OSError: [Errno 30] Read-only file system). "
                         "The committed checkpoints [4, 8] are intact"), "Read-only file system"),
])
def test_a_store_failing_under_a_run_stops_it_with_one_line_and_status_1(error, says, capsys):
    """What the soak's full disk and unwritable checkpoints end with: the cause in a line, not a traceback."""
    def main(argv):
        raise error

    with pytest.raises(SystemExit) as stopped:
        command_line._call(main, ["bert_jax/commands/pretrain.py"])
    assert stopped.value.code == command_line.STORAGE_FAULT_STATUS == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bert-jax pretrain: ") and says in lines[0], lines


def test_other_os_errors_keep_their_traceback():
    def main(argv):
        raise FileExistsError(errno.EEXIST, "File exists")

    with pytest.raises(FileExistsError):
        command_line._call(main, ["bert_jax/commands/pretrain.py"])


def test_a_failed_save_names_a_folder_that_refuses_writes(tmp_path):
    """orbax times out waiting for its step folder ("Timeout waiting for key ...step_directory_creation") when the
    folder cannot be made: the error names what refused it, found by a probe write."""
    from bert_jax.checkpoint import manager as ckpt  # noqa: PLC0415  (orbax: only these tests need it)

    blocked = tmp_path / "a_file"
    blocked.write_text("")
    assert "NotADirectoryError" in ckpt._unwritable(blocked / "checkpoints")
    assert ckpt._unwritable(tmp_path) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root (chmod does not stop root)")
def test_a_read_only_checkpoints_folder_stops_a_resume_before_anything_is_built(tmp_path):
    from bert_jax.configs import tiny  # noqa: PLC0415
    from bert_jax.run import harness  # noqa: PLC0415
    from bert_jax.storage.preflight import StorageError  # noqa: PLC0415

    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    subprocess.run(["mount", "--bind", str(checkpoints), str(checkpoints)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(checkpoints)], check=True)
        with pytest.raises(StorageError, match=r"checkpoints"):
            harness.check_storage(tiny.get_config(), str(tmp_path))
    finally:
        subprocess.run(["umount", str(checkpoints)], check=True)
