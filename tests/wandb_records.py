"""Read an offline W&B run file (``<run>/wandb/offline-run-*/run-<id>.wandb``) back, for the tests.

The file is W&B's record log: a 7-byte header (``:W&B``, magic, version), then 32 KiB blocks of chunks, each with
a 7-byte header (CRC, length, type: full, first, middle, last) in LevelDB's log layout; each whole record is a
``wandb_internal_pb2.Record``. wandb >= 0.2x writes it from its Go core and no longer ships a Python reader.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator:
    """Every ``Record`` of a ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, parts = HEADER, []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        _, size, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if left < HEADER or (size == 0 and kind == 0):  # the block's padding
            pos += left
            continue
        parts.append(data[pos + HEADER:pos + HEADER + size])
        pos += HEADER + size
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


def run_summary(path: Path) -> dict:
    """The run id, the config (key -> value, later updates win) and the history rows (key -> value) of one
    ``.wandb`` file."""
    out: dict = {"id": None, "config": {}, "history": []}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["id"] = record.run.run_id
            out["config"].update(_items(record.run.config.update))
        elif kind == "config":
            out["config"].update(_items(record.config.update))
        elif kind == "history":
            out["history"].append(_items(record.history.item))
    return out


def _items(items) -> dict:
    """key -> value of a record's items (a key is ``key`` or, for a nested one, ``nested_key`` joined by ``/``)."""
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}
