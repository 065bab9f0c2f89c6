"""What the tracking loggers (MLflow, W&B) share: finding the checkpoints a ModelCheckpoint saved since the last
upload, getting a local copy of one to upload (a remote checkpoint is downloaded first), and the check that an
optional package is installed, with the command that installs it."""

from __future__ import annotations

import importlib.util
import os
import posixpath
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strategies.checkpoint_io.filesystem import get_fs, is_remote, name
from strategies.comm.distributed import rank_zero_only

if TYPE_CHECKING:
    from callbacks.checkpoint import ModelCheckpoint


def require(package: str, extra: str, who: str) -> None:
    """Raise ModuleNotFoundError naming the extra to install when `package` is missing (without importing it)."""
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken install, or a module blocked in sys.modules
        found = False
    if not found:
        raise ModuleNotFoundError(
            f"{who} needs the '{package}' package, which is not installed: pip install \"trainer[{extra}]\" "
            f"(or pip install {package})."
        )


def on_rank_zero() -> bool:
    """Whether this process is global rank 0, the one that talks to the tracking service."""
    return getattr(rank_zero_only, "rank", 0) == 0


def checkpoint_stamp(path: str) -> int | None:
    """When the checkpoint at `path` was last written (ns), or None when it is gone or uncommitted."""
    if not is_remote(path):
        try:
            return Path(path).stat().st_mtime_ns
        except OSError:
            return None
    from strategies.checkpoint_io import object_store

    fs, inner = get_fs(path)
    record = object_store.read_record(fs, inner)
    return int(record["written_ns"]) if record is not None else None


def changed_checkpoints(callback: ModelCheckpoint, seen: dict[str, int]) -> list[str]:
    """The callback's kept checkpoints (top-k, best, last) that are new or rewritten since `seen` (updated)."""
    paths = list(dict.fromkeys([*callback.best_k_models, callback.best_model_path, callback.last_model_path]))
    changed = []
    for path in paths:
        stamp = checkpoint_stamp(path) if path else None
        if stamp is not None and seen.get(path) != stamp:
            seen[path] = stamp
            changed.append(path)
    return changed


def checkpoint_metadata(callback: ModelCheckpoint, path: str) -> dict[str, Any]:
    """What an uploaded checkpoint is: its score and the callback settings that chose it."""
    score = callback.best_k_models.get(path)
    return {"score": float(score) if score is not None else None, "original_filename": name(path),
            "best": path == callback.best_model_path,
            "ModelCheckpoint": {"monitor": callback.monitor, "mode": callback.mode, "save_last": callback.save_last,
                                "save_top_k": callback.save_top_k, "save_weights_only": callback.save_weights_only}}


@contextmanager
def local_checkpoint(path: str) -> Iterator[str]:
    """A local path holding the checkpoint (file or sharded folder); a remote one is downloaded to a temp folder."""
    if not is_remote(path):
        yield os.fspath(path)
        return
    from strategies.checkpoint_io import object_store

    fs, data, record = object_store.resolve(path)
    with tempfile.TemporaryDirectory(prefix="trainer-artifact-") as tmp:
        target = os.path.join(tmp, name(path))
        if (record is not None and record.get("kind") == "folder") or (record is None and fs.isdir(data)):
            fs.get(posixpath.join(data, ""), target + os.sep, recursive=True)
        else:
            fs.get_file(data, target)
        yield target
