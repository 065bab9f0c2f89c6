"""Atomic checkpoints on stores without rename (S3 and the other fsspec filesystems).

A local save writes a temp file and renames it over the target. An object store has no rename, so a remote
checkpoint `<folder>/<name>.ckpt` is two things:

- the data: a new object `<name>.ckpt.data-<token>` (or, for a sharded checkpoint, a new prefix of that name
  holding DCP's shard files and our manifest), written first, at a name no reader looks at;
- the commit record: a small JSON object at `<name>.ckpt` itself, naming the data, written last, in one PUT.

A reader follows the record; data objects that no record names are uncommitted and ignored (and deleted at the
next fit start). Until the new record lands, the old record still names the old data, so a save killed at any
moment leaves the previous checkpoint loadable; the old data is deleted only after the new record is written.
A plain object at a checkpoint path (a file uploaded by hand) still loads when named explicitly, but the
`ckpt_path="last"` search considers committed checkpoints only.

A record is data anyone with write access to the prefix can plant, and the data it names is deleted when the
record is replaced. So a record may name one thing only: `<its own name>.data-<token>` beside it (no folder part,
no `..`, no absolute or other-bucket path, not another checkpoint's data), with a known kind and a size. Any other
record is refused, on save, load and removal alike, before anything is read or deleted (`checked_record`).
"""

from __future__ import annotations

import json
import posixpath
import time
import warnings
from collections.abc import Callable
from typing import Any

from strategies.checkpoint_io.filesystem import get_fs, makedirs_in
from strategies.checkpoint_io.temp_owner import TMP_MARKER, owner_tag, writer_is_gone
from strategies.exceptions import CheckpointLoadError, CheckpointSaveError

DATA_MARKER = ".data-"
RECORD_KEY = "trainer_checkpoint_commit"
RECORD_MAX_BYTES = 4096  # a commit record is about 200 bytes; anything larger is not one


def _record(data_name: str, kind: str, size: int) -> bytes:
    return json.dumps({RECORD_KEY: 1, "data": data_name, "kind": kind, "size": size,
                       "written_ns": time.time_ns()}).encode()


def parse_record(raw: bytes) -> dict[str, Any] | None:
    """The commit record in `raw`, or None when `raw` is something else (e.g. a torch file)."""
    if len(raw) > RECORD_MAX_BYTES or not raw.startswith(b"{"):
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get(RECORD_KEY) == 1 else None


def record_problem(record: dict[str, Any], path: str) -> str | None:
    """Why the commit record at `path` (a path inside its filesystem) must not be followed, or None."""
    data, kind, size = record.get("data"), record.get("kind"), record.get("size")
    own = f"{posixpath.basename(path)}{DATA_MARKER}"
    if not isinstance(data, str) or not data.startswith(own) or "/" in data or "\\" in data or ".." in data:
        return (f"it names the data {data!r:.200}, but a commit record may name only '{own}<token>' beside itself "
                "(no folder, no '..', no absolute or other-bucket path)")
    if kind not in ("file", "folder"):
        return f"its kind is {kind!r:.60}, not 'file' or 'folder'"
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        return f"its size is {size!r:.60}, not a byte or file count"
    return None


def checked_record(record: dict[str, Any] | None, fs: Any, path: str, error: type[Exception]) -> dict[str, Any] | None:
    """`record` when it may be followed; else `error` naming the record's URL and why (nothing read or deleted)."""
    problem = None if record is None else record_problem(record, path)
    if problem is not None:
        raise error(f"the commit record {fs.unstrip_protocol(path)} was refused: {problem}. It was not written by "
                    "this trainer (planted or edited by hand); nothing was read or deleted. Remove that object "
                    "yourself once you know where it came from.")
    return record


def _head(fs: Any, path: str) -> bytes:
    """The first bytes of the object at `path`: enough to hold a record, one ranged GET (FileNotFoundError if none)."""
    try:
        return bytes(fs.cat_file(path, start=0, end=RECORD_MAX_BYTES + 1))
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise
    except OSError:  # S3 refuses any range of an empty object
        if fs.info(path).get("size", 0) == 0:
            return b""
        raise


def read_record(fs: Any, path: str, error: type[Exception] = CheckpointLoadError) -> dict[str, Any] | None:
    """The commit record at `path` (a path inside `fs`), or None when there is none; `error` for a record that
    must not be followed (`record_problem`)."""
    try:
        record = parse_record(_head(fs, path))
    except (FileNotFoundError, IsADirectoryError):
        return None
    return checked_record(record, fs, path, error)


def commit(fs: Any, path: str, data_name: str, kind: str, size: int) -> dict[str, Any] | None:
    """Write the record naming `data_name` (the commit); return the record it replaced, if any. A record there that
    must not be followed is a CheckpointSaveError, and nothing is written over it."""
    previous = read_record(fs, path, CheckpointSaveError)
    fs.pipe_file(path, _record(data_name, kind, size))
    return previous


def remove_data(fs: Any, folder: str, record: dict[str, Any] | None) -> None:
    """Delete the data a replaced (or removed) record named (a record checked by `read_record`); a failure leaves
    an orphan for the next cleanup."""
    if record is None:
        return
    try:
        fs.rm(posixpath.join(folder, record["data"]), recursive=record.get("kind") == "folder")
    except (OSError, ValueError):
        pass


def save(obj: Any, url: str, write: Callable[[Any, Any], None]) -> None:
    """Write `obj` as a new data object, then commit it; the previous checkpoint stays until the commit."""
    fs, path = get_fs(url)
    folder, base = posixpath.split(path)
    data_name = f"{base}{DATA_MARKER}{owner_tag()}"  # the writer in the name: clean-up spares a live one
    data_path = posixpath.join(folder, data_name)
    try:
        makedirs_in(fs, folder)
        with fs.open(data_path, "wb") as handle:
            write(obj, handle)
            size = handle.tell()
        previous = commit(fs, path, data_name, "file", size)
    except Exception as err:  # fsspec back ends raise OSError, but also their client's own errors
        try:
            fs.rm(data_path)
        except Exception:  # noqa: BLE001 - the object may not exist; an orphan is cleaned at the next start
            pass
        if isinstance(err, CheckpointSaveError):
            raise
        raise CheckpointSaveError(
            f"could not save checkpoint to {url} ({type(err).__name__}: {err}); the previous checkpoint, if any, "
            "is untouched. Check the URL, the credentials and write permission."
        ) from err
    remove_data(fs, folder, previous)


def resolve(url: str) -> tuple[Any, str, dict[str, Any] | None]:
    """(fs, data path, record) for a checkpoint URL: the committed data, or the object itself if it is not a record.

    Raises:
        CheckpointLoadError: nothing at `url`, or its record names data that is gone.
    """
    fs, path = get_fs(url)
    try:
        record = parse_record(_head(fs, path))
    except (FileNotFoundError, IsADirectoryError):
        fs.invalidate_cache(posixpath.dirname(path))
        if fs.isdir(path):  # a folder (e.g. a sharded checkpoint copied by hand)
            return fs, path, None
        raise CheckpointLoadError(f"checkpoint {url} does not exist. Check the path (or use ckpt_path='last').") \
            from None
    record = checked_record(record, fs, path, CheckpointLoadError)
    if record is None:
        return fs, path, None
    return fs, posixpath.join(posixpath.dirname(path), record["data"]), record


def missing_data(url: str, record: dict[str, Any]) -> CheckpointLoadError:
    return CheckpointLoadError(f"checkpoint {url} is committed, but its data {record['data']} is missing "
                               "(deleted by hand?).")


def read_bytes(url: str) -> bytes:
    """The bytes of the checkpoint file at `url` (following its commit record), size-checked against the record."""
    fs, data, record = resolve(url)
    if record is not None and record.get("kind") == "folder":
        raise CheckpointLoadError(f"checkpoint {url} is a directory, but a checkpoint file was expected. It is a "
                                  "sharded ZeRO checkpoint: load it with strategy='zero2' or 'zero3' (any number "
                                  "of processes).")
    try:
        raw = fs.cat_file(data)
    except (FileNotFoundError, IsADirectoryError):
        if record is not None:
            raise missing_data(url, record) from None
        raise CheckpointLoadError(f"checkpoint {url} is a directory, but a checkpoint file was expected.") from None
    if record is not None and len(raw) != record.get("size"):
        raise CheckpointLoadError(f"checkpoint {url} is not a valid checkpoint (truncated or corrupted): its data "
                                  f"holds {len(raw)} bytes, its commit record says {record.get('size')}.")
    return raw


def is_folder(url: str) -> bool:
    """True when `url` is a committed sharded checkpoint (or a plain remote folder)."""
    try:
        fs, data, record = resolve(url)
    except CheckpointLoadError:
        return False
    return record.get("kind") == "folder" if record is not None else bool(fs.isdir(data))


def _committed(fs: Any, paths: list[str]) -> list[tuple[int, str]]:
    if not paths:
        return []
    contents = fs.cat(paths, on_error="omit")
    found = []
    for path, raw in contents.items():
        record = parse_record(raw)
        if record is None:
            continue
        problem = record_problem(record, path)
        if problem is not None:
            warnings.warn(f"skipping the commit record {fs.unstrip_protocol(path)}: {problem}", stacklevel=3)
            continue
        written = record.get("written_ns", 0)
        found.append((written if isinstance(written, int) else 0, fs.unstrip_protocol(path)))
    return found


def find_checkpoints(pattern: str) -> list[tuple[int, str]]:
    """(commit time in ns, URL) of every committed checkpoint matching the glob `pattern` (e.g. `.../*.ckpt`)."""
    fs, inner = get_fs(pattern)
    fs.invalidate_cache()
    try:
        entries = fs.glob(inner, detail=True)
    except FileNotFoundError:
        return []
    paths = [p for p, e in entries.items() if e.get("type") == "file" and e.get("size", 0) <= RECORD_MAX_BYTES
             and DATA_MARKER not in posixpath.basename(p) and TMP_MARKER not in posixpath.basename(p)]
    return _committed(fs, paths)


def remove(url: str) -> None:
    """Delete a checkpoint: the record first (it is then uncommitted), then its data. A record that must not be
    followed is a CheckpointSaveError, and nothing is deleted."""
    fs, path = get_fs(url)
    record = read_record(fs, path, CheckpointSaveError)
    try:
        fs.rm(path, recursive=record is None and fs.isdir(path))
    except FileNotFoundError:
        pass
    remove_data(fs, posixpath.dirname(path), record)


def remove_uncommitted(folder_url: str) -> list[str]:
    """Delete data objects and prefixes that no commit record in `folder_url` names (a save cut short) and whose
    writer, recorded in their name, is provably gone: a live run's data being written is never deleted."""
    fs, folder = get_fs(folder_url)
    fs.invalidate_cache(folder)
    try:
        entries = fs.ls(folder, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    small = [e["name"] for e in entries if e.get("type") == "file" and e.get("size", 0) <= RECORD_MAX_BYTES]
    named = {(parse_record(raw) or {}).get("data") for raw in fs.cat(small, on_error="omit").values()} if small \
        else set()
    removed = []
    for entry in entries:
        base = posixpath.basename(entry["name"].rstrip("/"))
        if ((DATA_MARKER in base and base not in named) or TMP_MARKER in base) and writer_is_gone(base):
            try:
                fs.rm(entry["name"], recursive=entry.get("type") == "directory")
            except FileNotFoundError:
                continue
            removed.append(fs.unstrip_protocol(entry["name"]))
    return removed
