"""Checkpoint file I/O: atomic durable writes and safe (weights-only) reads with friendly errors.

A local path takes the temp-file-and-rename path below; a URL (s3://, memory://, ...) goes through
strategies/object_store.py, which commits with a small record instead of a rename.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import re
import shutil
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from strategies.exceptions import CheckpointLoadError, CheckpointSaveError
from strategies.filesystem import AnyPath, is_remote, to_path

TMP_MARKER = ".tmp-"


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_save(
    obj: Any, path: str | Path, write: Callable[[Any, Any], None] = torch.save
) -> None:
    """Write `obj` to `path` so that a crash at any moment leaves either the old file or the new one.

    The bytes go to a temp file in the same directory, are flushed and fsynced, then renamed over
    the target with os.replace (atomic on POSIX), and the directory entry is fsynced. On a remote store
    (a URL), the bytes go to a new object and a commit record names it (strategies/object_store.py).
    """
    path = to_path(path)  # a Path stays as it is; "file://x" becomes Path("x"); a URL stays a string
    if isinstance(path, str):
        from strategies import object_store

        object_store.save(obj, path, write)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CheckpointSaveError(f"cannot create checkpoint directory {path.parent}: {err}") from err
    tmp = path.with_name(f"{path.name}{TMP_MARKER}{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as handle:
            write(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise CheckpointSaveError(
            f"could not save checkpoint to {path} ({err.strerror or err}, errno {err.errno}); "
            "the previous checkpoint, if any, is untouched. Check free space and write permission."
        ) from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def remove_stale_temp_files(directory: str | Path) -> list[AnyPath]:
    """Delete temp files left by a writer that died mid-save (on a store: uncommitted data); return what was removed."""
    if is_remote(directory):
        from strategies import object_store

        return list(object_store.remove_uncommitted(os.fspath(directory)))
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = [p for p in directory.iterdir() if TMP_MARKER in p.name]
    for p in removed:
        if p.is_dir():  # an uncommitted sharded checkpoint folder
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return list(removed)


def _cause(err: BaseException) -> str:
    """A short cause, without torch's advice to retry with weights_only=False (we never do)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    kept = [line for line in lines if "weights_only" not in line and "documentation" not in line.lower()]
    text = " ".join(kept)[:200] or type(err).__name__
    return f"{type(err).__name__}: {text}"


def _load_weights_only(source: Path | bytes, map_location: str | torch.device | None) -> Any:
    """torch.load(weights_only=True). A file holding DTensors needs torch.distributed.tensor imported first, which
    `import trainer` skips (it costs about a second): import it then and load again, still weights-only."""
    def load() -> Any:
        return torch.load(io.BytesIO(source) if isinstance(source, bytes) else source, map_location=map_location,
                          weights_only=True)

    try:
        return load()
    except pickle.UnpicklingError as err:
        if "torch.distributed.tensor" not in str(err):
            raise
    importlib.import_module("torch.distributed.tensor")  # registers DTensor with the weights-only unpickler

    return load()


def safe_load(path: str | Path, map_location: str | torch.device | None = "cpu") -> dict[str, Any]:
    """Load a checkpoint with `weights_only=True`; every failure becomes a CheckpointLoadError."""
    path = to_path(path)
    if isinstance(path, str):
        from strategies import object_store

        raw = object_store.read_bytes(path)  # follows the commit record; checks the size
        if not raw:
            raise CheckpointLoadError(f"checkpoint {path} is empty (0 bytes): it is truncated or was never written.")
        return _checked_load(raw, path, map_location)
    if not path.exists():
        raise CheckpointLoadError(f"checkpoint {path} does not exist. Check the path (or use ckpt_path='last').")
    if path.is_dir():
        hint = (" It is a sharded ZeRO checkpoint folder: load it with strategy='zero2' or 'zero3' (any number "
                "of processes).") if (path / "manifest.pt").is_file() else ""
        raise CheckpointLoadError(f"checkpoint {path} is a directory, but a checkpoint file was expected.{hint}")
    if path.stat().st_size == 0:
        raise CheckpointLoadError(f"checkpoint {path} is empty (0 bytes): it is truncated or was never written.")
    return _checked_load(path, path, map_location)


def _checked_load(source: Path | bytes, path: str | Path, map_location: str | torch.device | None) -> dict[str, Any]:
    try:
        data = _load_weights_only(source, map_location)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))
        if found:
            raise CheckpointLoadError(
                f"checkpoint {path} was refused by the safe (weights-only) loader: it references {found.group(1)}, "
                "which is not allowed. Only tensors and plain Python values may be stored in a checkpoint; it is "
                "never loaded unsafely."
            ) from err
        raise CheckpointLoadError(
            f"checkpoint {path} is not a valid checkpoint (truncated or corrupted): {_cause(err)}"
        ) from err
    except (RuntimeError, EOFError, IndexError, ValueError, OSError, zipfile.BadZipFile, KeyError) as err:
        raise CheckpointLoadError(
            f"checkpoint {path} is not a valid checkpoint (truncated or corrupted): {_cause(err)}"
        ) from err
    if not isinstance(data, dict):
        raise CheckpointLoadError(f"checkpoint {path} holds a {type(data).__name__}, not a checkpoint dict.")
    return data


def find_checkpoints(folder: AnyPath, pattern: str = "*.ckpt") -> list[tuple[int, AnyPath]]:
    """(modification time in ns, path) of the checkpoints matching `pattern` under `folder` (a glob that may span
    folders, e.g. "version_*/checkpoints/*.ckpt"), temp files excluded; on a remote store, committed checkpoints
    only, timed by their commit record."""
    if is_remote(folder):
        from strategies import object_store

        return list(object_store.find_checkpoints(f"{os.fspath(folder).rstrip('/')}/{pattern}"))
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return [(p.stat().st_mtime_ns, p) for p in folder.glob(pattern) if TMP_MARKER not in p.name]


def remove_checkpoint(path: AnyPath) -> None:
    """Delete a checkpoint file or sharded folder (on a store: its commit record first, then its data)."""
    if is_remote(path):
        from strategies import object_store

        object_store.remove(os.fspath(path))
        return
    target = Path(path)
    if target.is_dir():
        shutil.rmtree(target, ignore_errors=True)
    else:
        target.unlink(missing_ok=True)
