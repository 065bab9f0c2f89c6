"""Sharded checkpoint folders for ZeRO-2/3: every rank writes its own shard with
torch.distributed.checkpoint (DCP), and rank 0 writes our manifest last, as the commit marker.

A folder is a checkpoint only if it has our manifest, it holds exactly the files the manifest lists, each with the
recorded sha256, and its `.metadata` passes an allowlisting read (strategies/checkpoint_io/sharded/manifest.py).
That check runs before DCP reads anything, and DCP then reads through readers that run nothing the folder holds
(strategies/checkpoint_io/sharded/safe_read.py): a foreign or tampered folder is refused without unpickling it.
Ranks agree on the verdict through one all-reduce, so no rank proceeds (or hangs) alone. With
`sharded_checkpoint="async"` the same write and commit run in a background thread after a CPU staging copy
(strategies/checkpoint_io/sharded/async_save.py); consolidation into one file is
strategies/checkpoint_io/sharded/consolidate.py.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path
from typing import Any

from strategies.checkpoint_io.atomic_file import TMP_MARKER, atomic_save, checked_target
from strategies.checkpoint_io.filesystem import is_remote
from strategies.checkpoint_io.sharded.async_save import AsyncSaver
from strategies.checkpoint_io.sharded.manifest import (
    MANIFEST,
    SHARDED_KEYS,
    SaveJob,
    ShardedRef,
    manifest_state,
    sha256_of,
    shard_payload,
    verified_manifest,
)
from strategies.checkpoint_io.sharded.remote import remote_job, verify_remote
from strategies.checkpoint_io.sharded.write_errors import write_cause
from strategies.checkpoint_io.temp_owner import owner_tag
from strategies.exceptions import CheckpointLoadError, CheckpointSaveError


def save_sharded(strategy: Any, checkpoint: dict[str, Any], path: str | Path, saver: AsyncSaver | None = None,
                 timeout: Any = None) -> None:
    """Collective. Shards go to a temp folder (or data prefix); rank 0 adds the manifest last, then commits.
    With `saver`, the shards and the state are staged on CPU here and written in the background
    (strategies/checkpoint_io/sharded/async_save.py); the previous save is waited for first."""
    if saver is not None:
        strategy.raise_if_any_failed(saver.join())  # at most one in flight: its error surfaces here
    path = checked_target(path)  # every rank, before any collective: an empty path fails alike everywhere
    if is_remote(path):
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
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.save(payload, process_group=group, **job.writer)
    except (Exception, CheckpointException) as err:  # noqa: BLE001 - DCP's is a BaseException holding every rank's
        return f"could not write the shards of {job.label} ({write_cause(err, job.label)}); the previous " \
               "checkpoint, if any, is untouched"
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
    files = {p.name: sha256_of(p) for p in sorted(tmp.iterdir())}
    atomic_save(manifest_state(checkpoint, files), tmp / MANIFEST)
    trash = folder.with_name(f"{folder.name}{TMP_MARKER}{token}-old")
    if folder.exists():
        os.replace(folder, trash)
    os.replace(tmp, folder)
    shutil.rmtree(trash, ignore_errors=True)


def load_sharded(strategy: Any, path: str | Path) -> dict[str, Any]:
    """Verify the folder on every rank, agree, then return the manifest with ShardedRefs for the tensors."""
    folder: Path | str
    if is_remote(path):
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
    """Fill `target` (a sharded state dict of the live model or optimizer) in place from the (verified) folder,
    through readers that run nothing the folder holds (strategies/checkpoint_io/sharded/safe_read.py)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from strategies.checkpoint_io.sharded.safe_read import (
        SafeFileSystemReader,
        SafeFsspecReader,
        SafeLoadPlanner,
        dcp_failure,
    )

    state = {key: target} if key == "model" else {"optim": {key: target}}
    reader = SafeFsspecReader(str(folder)) if is_remote(folder) else SafeFileSystemReader(str(folder))
    try:
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner())
    except CheckpointException as err:  # a BaseException: each rank's cause inside
        raise dcp_failure(err, str(folder)) from None
