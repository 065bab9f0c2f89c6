"""Sharded checkpoint folders for ZeRO-2/3: every rank writes its own shard with
torch.distributed.checkpoint (DCP), and rank 0 writes our manifest last, as the commit marker.

A folder is a checkpoint only if it has our manifest, and every file the manifest lists has the
recorded sha256. That check runs before DCP reads anything, because DCP reads `.metadata` with
pickle: a foreign or tampered folder is refused without unpickling it. Ranks agree on the verdict
through one all-reduce, so no rank proceeds (or hangs) alone. With `sharded_checkpoint="async"` the same write and
commit run in a background thread after a CPU staging copy (strategies/async_save.py); consolidation into one file
is strategies/sharded_consolidate.py.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strategies.async_save import AsyncSaver
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


@dataclass(frozen=True)
class SaveJob:
    """One sharded save's destination: where DCP writes (`checkpoint_id=` or `storage_writer=`), and rank 0's
    commit (manifest last, then the final name), which returns an error message or None."""

    label: str
    writer: dict[str, Any]
    commit: Callable[[dict[str, Any]], str | None]


def save_sharded(strategy: Any, checkpoint: dict[str, Any], path: str | Path, saver: AsyncSaver | None = None,
                 timeout: Any = None) -> None:
    """Collective. Shards go to a temp folder (or data prefix); rank 0 adds the manifest last, then commits.
    With `saver`, the shards and the state are staged on CPU here and written in the background
    (strategies/async_save.py); the previous save is waited for first."""
    if saver is not None:
        strategy.raise_if_any_failed(saver.join())  # at most one in flight: its error surfaces here
    if is_remote(path):
        from strategies.sharded_remote import remote_job

        job = remote_job(strategy, str(path))
    else:
        job = _local_job(strategy, Path(path))
    import torch.distributed.checkpoint as dcp  # heavy (DTensor): imported on first use, not with `trainer`

    rank_zero = strategy.is_global_zero
    if saver is None:
        error = _write(dcp, shard_payload(checkpoint), job, None)
        strategy.raise_if_any_failed(error)
        strategy.raise_if_any_failed(job.commit(checkpoint) if rank_zero else None)
        return
    group = saver.group(timeout)  # collective the first time: before anything runs in the background
    payload, state = _stage(checkpoint, rank_zero)

    def work() -> str | None:
        error = _write(dcp, payload, job, group)
        return error if error is not None or not rank_zero else job.commit(state)

    saver.start(work)


def _write(dcp: Any, payload: dict[str, Any], job: SaveJob, group: Any) -> str | None:
    try:
        dcp.save(payload, process_group=group, **job.writer)
    except Exception as err:  # noqa: BLE001 - DCP reports a failed rank's error on every rank
        return f"could not write the shards of {job.label}: {err}"
    return None


def _stage(checkpoint: dict[str, Any], rank_zero: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """CPU copies of this rank's shards and (rank 0) of the rest, so training may change the live state now."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    stager = DefaultStager(StagingOptions(False, False, False, False))  # synchronous copy into plain CPU memory
    try:
        payload = stager.stage(shard_payload(checkpoint))
    finally:
        stager.close()
    assert isinstance(payload, dict)
    state: dict[str, Any] = {"optimizer_states": [None] * len(checkpoint["optimizer_states"])}
    if rank_zero:
        state.update(copy.deepcopy({k: v for k, v in checkpoint.items() if k not in SHARDED_KEYS}))
    return payload, state


def _local_job(strategy: Any, folder: Path) -> SaveJob:
    token = strategy.broadcast(owner_tag())  # rank 0 owns the temp folder: its pid is in the name
    tmp = folder.with_name(f"{folder.name}{TMP_MARKER}{token}")

    def commit(checkpoint: dict[str, Any]) -> str | None:
        try:
            _commit(checkpoint, folder, tmp, token)
        except (OSError, CheckpointSaveError) as err:
            return f"could not commit {folder}: {err}; the previous checkpoint, if any, is untouched"
        return None

    return SaveJob(str(folder), {"checkpoint_id": str(tmp)}, commit)


def _commit(checkpoint: dict[str, Any], folder: Path, tmp: Path, token: str) -> None:
    """Rank 0: the manifest (commit marker) last, then the folder takes the final name."""
    files = {p.name: _sha256(p) for p in sorted(tmp.iterdir())}
    atomic_save(manifest_state(checkpoint, files), tmp / MANIFEST)
    trash = folder.with_name(f"{folder.name}{TMP_MARKER}{token}-old")
    if folder.exists():
        os.replace(folder, trash)
    os.replace(tmp, folder)
    shutil.rmtree(trash, ignore_errors=True)


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
        if _sha256(file) != digest:
            return None, f"{folder}: {name} does not match the sha256 in its manifest (changed or damaged)"
    return manifest, ""


def verify_folder(folder: Path) -> str | None:
    """Why a local sharded checkpoint folder cannot be loaded, or None when every shard matches its manifest."""
    manifest, problem = verified_manifest(folder)
    return None if manifest is not None else problem


def load_sharded(strategy: Any, path: str | Path) -> dict[str, Any]:
    """Verify the folder on every rank, agree, then return the manifest with ShardedRefs for the tensors."""
    folder: Path | str
    if is_remote(path):
        from strategies.sharded_remote import verify_remote

        manifest, problem, folder = verify_remote(str(path))  # folder: the committed data prefix
    else:
        folder = Path(path)
        manifest, problem = verified_manifest(folder)
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
