"""Integrity of checkpoint bytes: every entry of a torch zip archive is checked against the CRC-32 the archive
itself records, before anything is unpickled.

Why: `torch.load` does not check those CRCs, so flipped bytes inside a tensor load silently (weights of 8e37 were
trained on). The check runs over a read-only memory map of the file (or the bytes read from a store), so it costs
one pass of `zlib.crc32` and no copy; files written before this check existed carry the same CRCs and are checked
the same way. The same pass then checks every tensor storage's declared size against its record
(strategies/checkpoint_io/record_sizes.py), reading only the archive's pickle again. Sharded (ZeRO) folders carry
a sha256 per file in their manifest instead (strategies/checkpoint_io/sharded/manifest.py).
"""

from __future__ import annotations

import io
import mmap
import zipfile
import zlib
from pathlib import Path
from typing import Any

from strategies.checkpoint_io.record_sizes import check_record_sizes
from strategies.exceptions import CheckpointLoadError

_LOCAL_HEADER = 30  # bytes of a zip local file header before the name and the extra field


class DamagedEntry(CheckpointLoadError):
    """An entry of the archive does not match its recorded CRC-32."""

    def __init__(self, message: str, entry: str, found_crc: int) -> None:
        super().__init__(message)
        self.entry = entry
        self.found_crc = found_crc


def is_zip(view: memoryview | bytes) -> bool:
    return bytes(view[:4]) == b"PK\x03\x04"


def _entries(view: memoryview | bytes) -> list[zipfile.ZipInfo]:
    try:
        return zipfile.ZipFile(io.BytesIO(view) if isinstance(view, bytes) else _ViewReader(view)).infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as err:
        raise CheckpointLoadError(f"its zip directory is unreadable ({err})") from None


class _ViewReader(io.RawIOBase):
    """A seekable file over a memoryview, so zipfile can read the directory of a mapped file without copying it."""

    def __init__(self, view: memoryview) -> None:
        self._view, self._pos = view, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else (self._pos + offset if whence == 1 else len(self._view) + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        chunk = self._view[self._pos:self._pos + len(buffer)]
        buffer[:len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


def check_torchscript(view: memoryview | bytes, path: str | Path) -> None:
    """A TorchScript archive (torch.jit.save) is a zip too; say so instead of failing inside torch.load."""
    names = [info.filename for info in _entries(view)]
    if any(name.endswith("/constants.pkl") or "/code/" in name for name in names):
        raise CheckpointLoadError(
            f"checkpoint {path} is a TorchScript archive (written by torch.jit.save), not a training checkpoint: "
            "load it with torch.jit.load. A checkpoint is written by Trainer.save_checkpoint or ModelCheckpoint."
        )


def verify_crcs(view: memoryview | bytes) -> None:
    """Raise DamagedEntry for the first entry whose stored bytes do not match the archive's CRC-32, and
    CheckpointLoadError for a tensor storage whose record is not exactly the size its pickle declares
    (strategies/checkpoint_io/record_sizes.py: a memory-mapped load would read past it or stop short)."""
    entries = _entries(view)
    begins: dict[str, int] = {}
    for info in entries:
        if info.compress_type != zipfile.ZIP_STORED:
            raise CheckpointLoadError(
                f"entry '{info.filename}' is compressed; torch stores every entry as it is, so this archive was "
                "rebuilt by another tool. Load it with torch and save it again with torch.save")
        begin = _data_start(view, info)
        data = view[begin:begin + info.compress_size]
        if len(data) != info.compress_size:
            raise DamagedEntry(f"entry '{info.filename}' is cut short (the file is truncated)", info.filename, 0)
        found = zlib.crc32(data)
        if isinstance(data, memoryview):
            data.release()
        if found != info.CRC:
            raise DamagedEntry(
                f"entry '{info.filename}' fails its CRC-32 check (recorded {info.CRC:#010x}, found {found:#010x})",
                info.filename, found)
        begins[info.filename] = begin
    check_record_sizes(entries, lambda info: bytes(view[begins[info.filename]:begins[info.filename] +
                                                        info.compress_size]))


def _data_start(view: memoryview | bytes, info: zipfile.ZipInfo) -> int:
    """Where `info`'s stored bytes begin: after its local header, whose name and extra field lengths are its own."""
    start = info.header_offset
    header = bytes(view[start:start + _LOCAL_HEADER])
    if len(header) < _LOCAL_HEADER or header[:4] != b"PK\x03\x04":
        raise DamagedEntry(f"entry '{info.filename}' has a damaged header", info.filename, 0)
    name_len = int.from_bytes(header[26:28], "little")
    extra_len = int.from_bytes(header[28:30], "little")
    return start + _LOCAL_HEADER + name_len + extra_len


def verify_file(path: Path) -> None:
    """Check a local checkpoint file's zip CRCs through a read-only memory map (no copy). Not a zip: nothing to do
    here (torch.load gives the error)."""
    with open(path, "rb") as handle:
        try:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty file: reported by the caller
            return
    view = memoryview(mapped)
    try:
        if is_zip(view):
            check_torchscript(view, path)
            verify_crcs(view)
    finally:
        view.release()
        mapped.close()


def tensor_names_of_entry(loaded: Any, entry: str, found_crc: int) -> list[str]:
    """Which tensors of a (damaged, but loadable) checkpoint live in `entry`: those whose storage bytes have the
    CRC the damaged entry has now. Runs only on the error path, to name what was damaged."""
    import torch

    if "/data/" not in entry:
        return []
    names: list[str] = []

    def walk(value: Any, where: str) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            raw = torch.empty(0, dtype=torch.uint8).set_(storage).numpy() if storage.device.type == "cpu" else None
            if raw is not None and zlib.crc32(raw.tobytes()) == found_crc:
                names.append(where)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}[{key!r}]")
        elif isinstance(value, (list, tuple)):
            for idx, item in enumerate(value):
                walk(item, f"{where}[{idx}]")

    walk(loaded, "checkpoint")
    return names
