"""Reading back what a training run logged to wandb (offline) and TensorBoard, with the libraries' own formats."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

WANDB_BLOCK = 32768  # a .wandb file is a LevelDB-style log: 32 KiB blocks of (crc32c, length, kind) + payload records
WANDB_HEADER = 7  # b":W&B", a 2-byte magic, a 1-byte version


def _wandb_payloads(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    pos, pending = WANDB_HEADER, b""
    while pos + 7 <= len(data):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < 7:  # a block's tail too short for a record header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:  # zero padding up to the block's end
            pos += left
            continue
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:  # a whole record
            yield payload
        elif kind == 2:  # first fragment
            pending = payload
        elif kind == 3:  # middle
            pending += payload
        elif kind == 4:  # last
            yield pending + payload


def read_wandb_run(run_dir: Path) -> tuple[list[dict], dict]:
    """(history rows, config) of an offline wandb run directory (``offline-run-*``)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    history, config = [], {}
    for payload in _wandb_payloads(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "config":
            config |= {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                       for item in record.config.update}
    return history, config


def read_tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` of every event file below ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    for events in sorted(log_dir.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out
