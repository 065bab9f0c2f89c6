"""Atomic, durable checkpoint writes: a crash at any moment leaves the old file or the new one, never a mix.

A local path takes the temp-file-and-rename path below; a URL (s3://, memory://, ...) goes through
strategies/checkpoint_io/object_store.py, which commits with a small record instead of a rename. Reads are
in safe_load.py; finding and removing checkpoints in catalog.py.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from strategies.checkpoint_io import object_store
from strategies.checkpoint_io.filesystem import AnyPath, is_remote, to_path
from strategies.checkpoint_io.temp_owner import TMP_MARKER, owner_is_gone, temp_name, writer_is_gone
from strategies.exceptions import CheckpointSaveError

__all__ = ["TMP_MARKER", "atomic_save", "checked_target", "remove_stale_temp_files", "save_advice"]

_ADVICE = {
    errno.ENOSPC: "the disk is full: free some space or save to another folder",
    errno.EDQUOT: "the disk quota is exceeded: free some space or save to another folder",
    errno.EFBIG: "the file is larger than this filesystem or the process's file-size limit (ulimit -f) allows",
    errno.EROFS: "the filesystem is read-only: save to a writable folder",
    errno.EACCES: "permission denied: check the folder's write permission",
    errno.EPERM: "permission denied: check the folder's write permission",
    errno.EISDIR: "a directory has that name: choose another checkpoint file name",
    errno.ENOTDIR: "a part of the path is a file, not a folder: fix the path",
    errno.ENOENT: "the folder or the temp file vanished during the save (removed by another process?)",
    errno.EEXIST: "a file has the folder's name: remove it or choose another folder",
    errno.ENAMETOOLONG: "the file name is too long: shorten the filename template",
}


def save_advice(err: OSError) -> str:
    """What to do about a failed write, matching its errno."""
    return _ADVICE.get(err.errno or 0, "check the path, free space and write permission")


class _RecordingFile:
    """A file wrapper for torch.save that keeps the OSError of a failed write: torch's zip writer replaces it with
    `RuntimeError: [enforce fail at inline_container.cc]`, which says neither the errno nor the path."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self._handle.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def __getattr__(self, name: str) -> Any:  # fileno, tell, ... of the real file
        return getattr(self._handle, name)


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
    (a URL), the bytes go to a new object and a commit record names it (strategies/checkpoint_io/object_store.py).
    The temp file's name records its writer
    (strategies/checkpoint_io/temp_owner.py), so clean-up never deletes a live writer's file.

    Raises:
        CheckpointSaveError: the write failed; the message names the path, the errno and what to do about it.
    """
    path = checked_target(path)
    if isinstance(path, str):
        object_store.save(obj, path, write)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CheckpointSaveError(
            f"cannot create checkpoint directory {path.parent} ({err.strerror or err}): {save_advice(err)}."
        ) from err
    tmp = path.with_name(temp_name(path.name))
    recording: _RecordingFile | None = None
    try:
        with open(tmp, "wb") as handle:
            recording = _RecordingFile(handle)
            write(obj, recording)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as err:
        _discard(tmp)
        raise _save_error(path, err) from err
    except RuntimeError:  # torch's writer: the real cause is the OSError it swallowed
        _discard(tmp)
        if recording is not None and recording.error is not None:
            raise _save_error(path, recording.error) from recording.error
        raise
    except BaseException:
        _discard(tmp)
        raise
    _fsync_dir(path.parent)


def checked_target(path: Any) -> AnyPath:
    """`path` as a Path or URL (a "file://x" becomes Path("x")); CheckpointSaveError when it names no file."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).strip():
        raise CheckpointSaveError(f"cannot save a checkpoint to {path!r}: give a file path, e.g. 'model.ckpt' "
                                  "(or a folder path for a sharded checkpoint)")
    target = to_path(path)
    if isinstance(target, Path) and (not target.name or target.name in (".", "..")):
        raise CheckpointSaveError(f"cannot save a checkpoint to {os.fspath(path)!r}: it names a folder, not a file; "
                                  "give a file path, e.g. 'model.ckpt'")
    return target


def _save_error(path: Path, err: OSError) -> CheckpointSaveError:
    name = errno.errorcode.get(err.errno or 0, "")
    return CheckpointSaveError(
        f"could not save checkpoint to {path} ({name + ': ' if name else ''}{err.strerror or err}); the previous "
        f"checkpoint, if any, is untouched. {save_advice(err)[0].upper()}{save_advice(err)[1:]}."
    )


def _discard(tmp: Path) -> None:
    """Remove our temp file after a failure; a failure to remove it (a read-only filesystem) must not replace the
    error being reported."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def remove_stale_temp_files(directory: str | Path) -> list[AnyPath]:
    """Delete temp files whose writer provably died mid-save (on a store: uncommitted data); return what was removed.

    A temp file of a live run, of another machine, or without a recorded owner is left alone."""
    if is_remote(directory):
        return list(object_store.remove_uncommitted(os.fspath(directory)))
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = [p for p in directory.iterdir()
               if TMP_MARKER in p.name and writer_is_gone(p.name) or p.name.endswith(".claim") and _stale_claim(p)]
    for p in removed:
        if p.is_dir():  # an uncommitted sharded checkpoint folder
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                p.unlink(missing_ok=True)
            except OSError:
                pass
    return list(removed)


def _stale_claim(claim: Path) -> bool:
    try:
        tag = claim.read_text()
    except OSError:
        return False
    return bool(tag) and owner_is_gone(tag)

