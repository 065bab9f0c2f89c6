"""Checkpoint file I/O: atomic durable writes and safe (weights-only) reads with friendly errors.

A local path takes the temp-file-and-rename path below; a URL (s3://, memory://, ...) goes through
strategies/object_store.py, which commits with a small record instead of a rename.
"""

from __future__ import annotations

import errno
import importlib
import io
import os
import pickle
import re
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from strategies.checkpoint_integrity import (
    DamagedEntry,
    check_torchscript,
    is_zip,
    tensor_names_of_entry,
    verify_crcs,
    verify_file,
)
from strategies.exceptions import CheckpointLoadError, CheckpointSaveError
from strategies.filesystem import AnyPath, is_remote, to_path
from strategies.temp_owner import TMP_MARKER, owner_is_gone, temp_name, writer_is_gone
from strategies.weights_only import LIGHTNING_DICTS, LIGHTNING_MARKER, load_with_stand_ins, pickle_mentions

__all__ = ["TMP_MARKER", "atomic_save", "find_checkpoints", "remove_checkpoint", "remove_stale_temp_files",
           "safe_load", "save_advice"]

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
    (a URL), the bytes go to a new object and a commit record names it (strategies/object_store.py).
    The temp file's name records its writer
    (strategies/temp_owner.py), so clean-up never deletes a live writer's file.

    Raises:
        CheckpointSaveError: the write failed; the message names the path, the errno and what to do about it.
    """
    path = to_path(path)  # a Path stays as it is; "file://x" becomes Path("x"); a URL stays a string
    if isinstance(path, str):
        from strategies import object_store

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
        from strategies import object_store

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


def _cause(err: BaseException) -> str:
    """A short cause, without torch's advice to retry with weights_only=False (we never do)."""
    text = str(err)
    found = re.search(r"WeightsUnpickler error: (.*)", text, re.S)  # torch's verdict, after its advice
    sentences = re.split(r"(?<=\.)\s+|\n+", found.group(1) if found else text)
    kept = [part.strip() for part in sentences
            if part.strip() and not any(word in part.lower() for word in _ADVICE_WORDS)]
    text = " ".join(kept)[:200] or type(err).__name__
    return f"{type(err).__name__}: {text}"


_ADVICE_WORDS = ("weights_only", "documentation", "trust the source", "two options", "add_safe_globals",
                 "safe_globals")


def _clean_cause(err: BaseException) -> BaseException:
    """The same error without torch's advice to retry with weights_only=False (our docs forbid it), its traceback
    kept: chained under our CheckpointLoadError, it shows the real cause and nothing that advises an unsafe load."""
    text = _cause(err).split(": ", 1)[-1]
    try:
        clean = type(err)(text)
    except Exception:  # noqa: BLE001 - an error type with another constructor
        clean = RuntimeError(text)
    return clean.with_traceback(err.__traceback__)


def _load_weights_only(source: Path | bytes, map_location: str | torch.device | None, mmap: bool) -> Any:
    """torch.load(weights_only=True). A file holding DTensors needs torch.distributed.tensor imported first, which
    `import trainer` skips (it costs about a second): import it then and load again, still weights-only."""
    def load() -> Any:
        if isinstance(source, bytes):
            return torch.load(io.BytesIO(source), map_location=map_location, weights_only=True)
        return torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)

    try:
        return load()
    except pickle.UnpicklingError as err:
        if "torch.distributed.tensor" not in str(err):
            raise
    importlib.import_module("torch.distributed.tensor")  # registers DTensor with the weights-only unpickler

    return load()


def safe_load(path: str | Path, map_location: str | torch.device | None = "cpu") -> dict[str, Any]:
    """Load a checkpoint with `weights_only=True`; every failure becomes a CheckpointLoadError.

    Every entry is checked against the CRC-32 its zip archive records before anything is unpickled
    (strategies/checkpoint_integrity.py). A local file is then memory-mapped (copy-on-write): its tensors are
    read when they are copied into the model, and the check has already read the file once, so the whole load
    costs about what `torch.load` alone does (benchmarks/checkpoint.py).
    """
    path = to_path(path)
    if isinstance(path, str):
        from strategies import object_store

        raw = object_store.read_bytes(path)  # follows the commit record; checks the size
        if not raw:
            raise CheckpointLoadError(f"checkpoint {path} is empty (0 bytes): it is truncated or was never written.")
        if is_zip(raw):
            check_torchscript(raw, path)
            _verify(lambda: verify_crcs(raw), raw, path)
        return _checked_load(raw, path, map_location)
    if not path.exists():
        raise CheckpointLoadError(f"checkpoint {path} does not exist. Check the path (or use ckpt_path='last').")
    if path.is_dir():
        hint = (" It is a sharded ZeRO checkpoint folder: load it with strategy='zero2' or 'zero3' (any number "
                "of processes).") if (path / "manifest.pt").is_file() else ""
        raise CheckpointLoadError(f"checkpoint {path} is a directory, but a checkpoint file was expected.{hint}")
    if path.stat().st_size == 0:
        raise CheckpointLoadError(f"checkpoint {path} is empty (0 bytes): it is truncated or was never written.")
    _verify(lambda: verify_file(path), path, path)
    return _checked_load(path, path, map_location)


def _verify(check: Callable[[], Any], source: Path | bytes, path: AnyPath) -> None:
    """Run an integrity `check`; a damaged entry becomes a CheckpointLoadError naming the file, entry and tensors."""
    try:
        check()
    except DamagedEntry as err:
        where = ""
        try:  # the error path only: load the damaged file to name the tensors in the damaged entry
            names = tensor_names_of_entry(_load_weights_only(source, "cpu", mmap=False), err.entry, err.found_crc)
            where = f" (it holds {', '.join(names)})" if names else ""
        except Exception:  # noqa: BLE001 - too damaged to load: the entry's name is all we can give
            pass
        raise CheckpointLoadError(
            f"checkpoint {path} is damaged: {err}{where}. Its bytes changed after it was written (disk, copy or "
            "transfer error); restore it from a copy or resume from another checkpoint."
        ) from None
    except CheckpointLoadError as err:
        if str(path) in str(err):
            raise
        raise CheckpointLoadError(f"checkpoint {path} is not a valid checkpoint (truncated or corrupted): {err}.") \
            from None


def _checked_load(source: Path | bytes, path: str | Path, map_location: str | torch.device | None) -> dict[str, Any]:
    mmap = isinstance(source, Path) and _is_zip_file(source)
    try:
        data = _load_weights_only(source, map_location, mmap)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL (\S+)", str(err))
        data = _load_lightning_file(source, path, map_location, err) if found and pickle_mentions(
            source, LIGHTNING_MARKER) else None
        if data is not None:
            return data
        if found:
            raise CheckpointLoadError(
                f"checkpoint {path} was refused by the safe (weights-only) loader: it references {found.group(1)}, "
                "which is not allowed. Only tensors and plain Python values may be stored in a checkpoint; it is "
                "never loaded unsafely."
            ) from _clean_cause(err)
        raise CheckpointLoadError(
            f"checkpoint {path} is not a valid checkpoint (truncated or corrupted): {_cause(err)}"
        ) from _clean_cause(err)
    except (RuntimeError, EOFError, IndexError, ValueError, OSError, zipfile.BadZipFile, KeyError) as err:
        raise CheckpointLoadError(
            f"checkpoint {path} is not a valid checkpoint (truncated or corrupted): {_cause(err)}"
        ) from _clean_cause(err)
    if not isinstance(data, dict):
        raise CheckpointLoadError(f"checkpoint {path} holds a {type(data).__name__}, not a checkpoint dict.")
    return data


def _load_lightning_file(source: Path | bytes, path: str | Path, map_location: str | torch.device | None,
                         err: pickle.UnpicklingError) -> dict[str, Any] | None:
    """A Lightning checkpoint whose pickle names classes the safe loader refuses (hyperparameters holding a
    Namespace, a class, ...): still weights-only, with those rebuilt as StandIns for the reader to report.
    None when the file turns out not to be a Lightning checkpoint (it is then refused as usual)."""
    try:
        data = load_with_stand_ins(source, map_location, LIGHTNING_DICTS)
    except (pickle.UnpicklingError, RuntimeError, ValueError, TypeError) as again:
        raise CheckpointLoadError(
            f"checkpoint {path} (written by PyTorch Lightning) was refused by the safe (weights-only) loader even "
            f"with its unknown classes stood in for: {_cause(again)}. It is never loaded unsafely."
        ) from _clean_cause(err)
    if not isinstance(data, dict) or "format_version" in data or LIGHTNING_MARKER.decode() not in data:
        return None  # not a Lightning checkpoint after all: refused as any other file
    return data


def _is_zip_file(path: Path) -> bool:
    with open(path, "rb") as handle:
        return is_zip(handle.read(4))


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


def link_checkpoint(target: Path, link: Path) -> None:
    """Point `link` (e.g. `last.ckpt`) at `target` with a relative symlink, swapped in atomically: a reader sees the
    old link or the new one, never none."""
    staged = link.with_name(f".{link.name}.{os.getpid()}.link")
    staged.unlink(missing_ok=True)
    os.symlink(os.path.relpath(target, link.parent), staged)
    os.replace(staged, link)


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


def checkpoint_problem(path: AnyPath) -> str | None:
    """Why the local checkpoint at `path` cannot be loaded (damaged bytes, truncated, a folder without its
    manifest), or None when it looks intact. Reads the file once (its CRCs); unpickles nothing."""
    if is_remote(path):
        return None  # read once, when it is loaded
    target = Path(path)
    try:
        if target.is_dir():
            from strategies.sharded_checkpoint import verify_folder

            return verify_folder(target)
        if target.stat().st_size == 0:
            return f"{target} is empty"
        _verify(lambda: verify_file(target), target, target)
    except CheckpointLoadError as err:
        return str(err)
    except OSError as err:
        return f"{target}: {err}"
    return None
