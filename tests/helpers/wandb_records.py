"""Read the records of an offline wandb run (`run-<id>.wandb`) back, to check what WandbLogger wrote.

wandb 0.31 no longer ships a Python reader. The file is a LevelDB-style log: a 7-byte header (":W&B", a 2-byte
magic, a version byte), then 32 KiB blocks of chunks, each with a 7-byte header (crc32, length, type: 1 full,
2 first, 3 middle, 4 last); a record is one serialized `wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7


def records(path: Path) -> Iterator[Any]:
    """The complete records in the file as it is now; a file still being written ends at its last whole record."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the rest of a block too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        pos += HEADER
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += left - HEADER
            continue
        if pos + length > len(data):  # wandb's service is still writing this chunk: read it on a later look
            return
        chunk = data[pos:pos + length]
        pos += length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def run_files(save_dir: Path, count: int, timeout: float = 60) -> list[Path]:
    """The `count` complete run files under `save_dir`, oldest first: an offline run resumed in the same process (a
    `test` after `fit`: WandbLogger finishes the run at the end of each) writes a folder per part, same run id."""
    deadline = time.monotonic() + timeout
    while True:
        found = sorted((save_dir / "wandb").glob("offline-run-*/run-*.wandb"))
        if len(found) == count and all(path.stat().st_size > HEADER and any(
                r.WhichOneof("record_type") == "exit" for r in records(path)) for path in found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not {count} complete wandb run files under {save_dir} after {timeout:.0f} s: "
                                 f"{found}")
        time.sleep(0.2)


def run_file(save_dir: Path, timeout: float = 60) -> Path:
    """The run file under `save_dir`, once complete: wandb's service process writes it after `run.finish()` has
    returned (measured: right after finish the file can still hold only its 7-byte header), so wait for the
    run's `exit` record."""
    deadline = time.monotonic() + timeout
    while True:
        found = sorted((save_dir / "wandb").glob("offline-run-*/run-*.wandb"))
        if len(found) == 1 and found[0].stat().st_size > HEADER and any(
                r.WhichOneof("record_type") == "exit" for r in records(found[0])):
            return found[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"no complete wandb run file under {save_dir} after {timeout:.0f} s: {found}")
        time.sleep(0.1)


def of_type(path: Path, kind: str) -> list[Any]:
    return [getattr(r, kind) for r in records(path) if r.WhichOneof("record_type") == kind]
