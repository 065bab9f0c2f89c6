"""The manifest of a sharded checkpoint folder: what it records (the non-sharded state and every shard file's
sha256) and the check that a folder matches it, run before DCP reads anything (DCP unpickles `.metadata`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strategies.checkpoint_io import object_store
from strategies.checkpoint_io.filesystem import is_remote
from strategies.checkpoint_io.safe_load import safe_load
from strategies.exceptions import CheckpointLoadError

MANIFEST = "manifest.pt"
SHARDED_KEYS = ("state_dict", "optimizer_states")


@dataclass(frozen=True)
class ShardedRef:
    """Stands in a loaded checkpoint dict for tensors that stay in the folder until loaded into place."""

    folder: Path | str  # a URL for a checkpoint on a remote store
    key: str


def sha256_of(path: Path) -> str:
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
        return object_store.is_folder(str(path))
    return Path(path).is_dir()


@dataclass(frozen=True)
class SaveJob:
    """One sharded save's destination: where DCP writes (`checkpoint_id=` or `storage_writer=`), and rank 0's
    commit (manifest last, then the final name), which returns an error message or None."""

    label: str
    writer: dict[str, Any]
    commit: Callable[[dict[str, Any]], str | None]


def verified_manifest(folder: Path) -> tuple[dict[str, Any] | None, str]:
    """(the manifest, "") when every shard of the local folder matches it, else (None, why not)."""
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
        if sha256_of(file) != digest:
            return None, f"{folder}: {name} does not match the sha256 in its manifest (changed or damaged)"
    return manifest, ""


def verify_folder(folder: Path) -> str | None:
    """Why a local sharded checkpoint folder cannot be loaded, or None when every shard matches its manifest."""
    manifest, problem = verified_manifest(folder)
    return None if manifest is not None else problem
