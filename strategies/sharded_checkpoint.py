"""Sharded checkpoint folders for ZeRO-2/3: every rank writes its own shard with
torch.distributed.checkpoint (DCP), and rank 0 writes our manifest last, as the commit marker.

A folder is a checkpoint only if it has our manifest, and every file the manifest lists has the
recorded sha256. That check runs before DCP reads anything, because DCP reads `.metadata` with
pickle: a foreign or tampered folder is refused without unpickling it. Ranks agree on the verdict
through one all-reduce, so no rank proceeds (or hangs) alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strategies.checkpoint_io import TMP_MARKER, atomic_save, safe_load
from strategies.exceptions import CheckpointLoadError, CheckpointSaveError
from strategies.filesystem import is_remote
from strategies.temp_owner import owner_tag

MANIFEST = "manifest.pt"
SHARDED_KEYS = ("state_dict", "optimizer_states")


@dataclass(frozen=True)
class ShardedRef:
    """Stands in a loaded checkpoint dict for tensors that stay in the folder until loaded into place."""

    folder: Path | str  # a URL for a checkpoint on a remote store
    key: str


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def shard_payload(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What DCP writes: the model's and the optimizers' sharded states."""
    return {"model": checkpoint["state_dict"],
            "optim": {str(i): state for i, state in enumerate(checkpoint["optimizer_states"])}}


def manifest_state(checkpoint: dict[str, Any], files: dict[str, str]) -> dict[str, Any]:
    """The manifest: everything but the sharded states, and the shard files with their fingerprints."""
    rest = {k: v for k, v in checkpoint.items() if k not in SHARDED_KEYS}
    return {**rest, "optimizer_count": len(checkpoint["optimizer_states"]), "sharded_files": files}


def is_folder_checkpoint(path: str | Path) -> bool:
    """True when `path` names a sharded checkpoint folder (locally, or committed on a remote store)."""
    if is_remote(path):
        from strategies import object_store

        return object_store.is_folder(str(path))
    return Path(path).is_dir()


def save_sharded(strategy: Any, checkpoint: dict[str, Any], path: str | Path) -> None:
    """Collective. Shards go to a temp folder; rank 0 adds the manifest last, then renames the folder."""
    if is_remote(path):
        from strategies.sharded_remote import save_sharded_remote

        return save_sharded_remote(strategy, checkpoint, str(path))
    folder = Path(path)
    token = strategy.broadcast(owner_tag())  # rank 0 owns the temp folder: its pid is in the name
    tmp = folder.with_name(f"{folder.name}{TMP_MARKER}{token}")
    payload = shard_payload(checkpoint)
    import torch.distributed.checkpoint as dcp  # heavy (DTensor): imported on first use, not with `trainer`

    error = None
    try:
        dcp.save(payload, checkpoint_id=str(tmp))
    except Exception as err:  # DCP reports a failed rank's error on every rank
        error = f"could not write the shards of {folder}: {err}"
    strategy.raise_if_any_failed(error)
    if strategy.is_global_zero:
        try:
            _commit(checkpoint, folder, tmp, token)
        except (OSError, CheckpointSaveError) as err:
            error = f"could not commit {folder}: {err}; the previous checkpoint, if any, is untouched"
    strategy.raise_if_any_failed(error)


def _commit(checkpoint: dict[str, Any], folder: Path, tmp: Path, token: str) -> None:
    """Rank 0: the manifest (commit marker) last, then the folder takes the final name."""
    files = {p.name: _sha256(p) for p in sorted(tmp.iterdir())}
    atomic_save(manifest_state(checkpoint, files), tmp / MANIFEST)
    trash = folder.with_name(f"{folder.name}{TMP_MARKER}{token}-old")
    if folder.exists():
        os.replace(folder, trash)
    os.replace(tmp, folder)
    shutil.rmtree(trash, ignore_errors=True)


def _verify(folder: Path) -> tuple[dict[str, Any] | None, str]:
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return None, (f"{folder} has no {MANIFEST}: it is not a committed checkpoint of this trainer "
                      "(or its save was cut short)")
    try:
        manifest = safe_load(manifest_path)
    except CheckpointLoadError as err:
        return None, str(err)
    for name, digest in manifest.get("sharded_files", {}).items():
        file = folder / name
        if not file.is_file():
            return None, f"{folder} is missing the shard file {name}"
        if _sha256(file) != digest:
            return None, f"{folder}: {name} does not match the sha256 in its manifest (changed or damaged)"
    return manifest, ""


def verify_folder(folder: Path) -> str | None:
    """Why a local sharded checkpoint folder cannot be loaded, or None when every shard matches its manifest."""
    manifest, problem = _verify(folder)
    return None if manifest is not None else problem


def load_sharded(strategy: Any, path: str | Path) -> dict[str, Any]:
    """Verify the folder on every rank, agree, then return the manifest with ShardedRefs for the tensors."""
    folder: Path | str
    if is_remote(path):
        from strategies.sharded_remote import verify_remote

        manifest, problem, folder = verify_remote(str(path))  # folder: the committed data prefix
    else:
        folder = Path(path)
        manifest, problem = _verify(folder)
    if not strategy.reduce_boolean_decision(manifest is not None, all=True):
        raise CheckpointLoadError(problem or f"{folder}: another rank found this sharded checkpoint invalid.")
    assert manifest is not None
    manifest.pop("sharded_files", None)
    count = int(manifest.get("optimizer_count", 1))
    return {**manifest, "state_dict": ShardedRef(folder, "model"),
            "optimizer_states": [ShardedRef(folder, str(i)) for i in range(count)]}


def load_into(folder: Path | str, key: str, target: dict[str, Any]) -> None:
    """Fill `target` (a sharded state dict of the live model or optimizer) in place from the folder."""
    import torch.distributed.checkpoint as dcp

    state = {key: target} if key == "model" else {"optim": {key: target}}
    if is_remote(folder):
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

        dcp.load(state, storage_reader=FsspecReader(str(folder)))
        return
    dcp.load(state, checkpoint_id=str(folder))
