"""The checkpoints a folder (or a store prefix) holds: finding them, removing one, and why one cannot be loaded."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from strategies.checkpoint_io import object_store
from strategies.checkpoint_io.filesystem import AnyPath, is_remote
from strategies.checkpoint_io.integrity import (
    verify_file,
)
from strategies.checkpoint_io.safe_load import check_integrity
from strategies.checkpoint_io.sharded.manifest import verify_folder
from strategies.checkpoint_io.temp_owner import TMP_MARKER
from strategies.exceptions import CheckpointLoadError


def find_checkpoints(folder: AnyPath, pattern: str = "*.ckpt") -> list[tuple[int, AnyPath]]:
    """(modification time in ns, path) of the checkpoints matching `pattern` under `folder` (a glob that may span
    folders, e.g. "version_*/checkpoints/*.ckpt"), temp files excluded; on a remote store, committed checkpoints
    only, timed by their commit record."""
    if is_remote(folder):
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
            return verify_folder(target)
        if target.stat().st_size == 0:
            return f"{target} is empty"
        check_integrity(lambda: verify_file(target), target, target)
    except CheckpointLoadError as err:
        return str(err)
    except OSError as err:
        return f"{target}: {err}"
    return None
