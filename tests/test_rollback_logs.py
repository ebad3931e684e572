"""What a spike rollback leaves in the logs that cannot drop a row (bert_jax/run/metrics_writer.py's rewind):
TensorBoard and wandb keep the rolled-back rows, mark where they end with train/rolled_back_to, and keep the rows
trained again (wandb ignores a row logged at a step below its newest, unless its x axis is a metric)."""
import glob
import os
import struct
import time

import pytest

import bert_jax.configs.tiny
from bert_jax.run.metrics_writer import MetricsWriter

ROWS = (1, 2, 3, 4)  # logged, then rolled back to step 2 and trained again: 3, 4
GOOD = 2
ROLLED_BACK_TO = "train/rolled_back_to"  # the marker's name, as docs/guides/long-runs.md gives it


def rolled_back_run(workdir: str, tensorboard: bool, wandb_mode: str) -> None:
    c = bert_jax.configs.tiny.get_config()
    c.logging.update(tensorboard=tensorboard, wandb_mode=wandb_mode, plots=False)
    writer = MetricsWriter(workdir, c, 0)
    for step in ROWS:
        writer.write(step, {"train/loss": float(step)})
    writer.rewind(GOOD)
    for step in ROWS[GOOD:]:
        writer.write(step, {"train/loss": 10.0 + step})
    writer.close()


def records(data: bytes, start: int, header: int, length_of):
    """The payloads of a framed log: (length, payload) records after `start`."""
    pos, out = start, []
    while pos + header <= len(data):
        length, skip = length_of(data, pos)
        out.append(data[pos + header: pos + header + length])
        pos += header + length + skip
    return out


def tensorboard_scalars(workdir: str) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in the run's TensorBoard event files (TFRecord: length, crc, data, crc)."""
    from tensorboardX.proto import event_pb2

    out = []
    for path in sorted(glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))):
        data = open(path, "rb").read()
        for payload in records(data, 0, 12, lambda d, p: (struct.unpack("<Q", d[p:p + 8])[0], 4)):
            event = event_pb2.Event.FromString(payload)
            out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return out


def test_tensorboard_keeps_the_rolled_back_rows_and_marks_where_they_end(tmp_path):
    rolled_back_run(str(tmp_path), tensorboard=True, wandb_mode="disabled")
    scalars = tensorboard_scalars(str(tmp_path))
    assert [(s, v) for tag, s, v in scalars if tag == "train/loss"] == [(1, 1), (2, 2), (3, 3), (4, 4), (3, 13),
                                                                       (4, 14)]
    assert [(s, v) for tag, s, v in scalars if tag == ROLLED_BACK_TO] == [(4, GOOD)]
    assert [r.split('"step": ')[1].split(",")[0] for r in (tmp_path / "metrics.jsonl").read_text().splitlines()] \
        == ["1", "2", "3", "4"]  # metrics.jsonl drops them


def wandb_records(workdir: str) -> list:
    """The records of the run's offline wandb file (a LevelDB log of wandb_internal_pb2.Records: 32 KiB blocks, each
    record a 7-byte header (crc, length, type) and its data, split across blocks by type)."""
    from wandb.proto import wandb_internal_pb2

    out = []
    for path in glob.glob(os.path.join(workdir, "wandb", "offline-run-*", "run-*.wandb")):
        data, pos, pending = open(path, "rb").read(), 7, b""  # 7: the file's W&B header
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            length, kind = struct.unpack("<HB", data[pos + 4:pos + 7]) if left >= 7 else (0, 0)
            if kind == 0:  # a block's zero padding
                pos += left
                continue
            pending, pos = pending + data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 4):  # a whole record, or a split one's last part
                out.append(wandb_internal_pb2.Record.FromString(pending))
                pending = b""
    return out


def wandb_history(workdir: str, timeout_s: float = 60.0) -> list[dict]:
    """The history rows of the finished offline run, once wandb's service has written its exit record (run.finish
    returns before the file is flushed)."""
    deadline = time.monotonic() + timeout_s
    found = wandb_records(workdir)
    while not any(r.WhichOneof("record_type") == "exit" for r in found):
        assert time.monotonic() < deadline, "wandb wrote no exit record"
        time.sleep(0.2)
        found = wandb_records(workdir)
    rows = []
    for record in found:
        if record.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): i.value_json for i in record.history.item}
            row = {k: float(v) for k, v in items.items() if not k.startswith("_")}
            rows.append({"step": float(items["_step"]), **row})  # wandb's own step, unless the run logs `step`
    return rows


@pytest.mark.slow  # wandb's service starts: ~5 s
def test_wandb_keeps_the_rows_trained_again_after_a_rollback_and_marks_it(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    rolled_back_run(str(tmp_path), tensorboard=False, wandb_mode="offline")
    rows = wandb_history(str(tmp_path))
    assert [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r] == [(1, 1), (2, 2), (3, 3), (4, 4),
                                                                                (3, 13), (4, 14)]
    assert [(r["step"], r[ROLLED_BACK_TO]) for r in rows if ROLLED_BACK_TO in r] == [(4, GOOD)]
