"""One file from a sharded (ZeRO-2/3) checkpoint folder: `python -m trainer consolidate <folder> <file>`.

The folder is verified first (the manifest and the sha256 of every shard, strategies/checkpoint_io/sharded/folder.py),
then DCP reads every shard in this one process, with no process group, into whole tensors. The file has the standard
single-file layout (docs/checkpointing.md): the manifest's state, `state_dict` with the module's keys, and
`optimizer_states` indexed by parameter position, so it loads on one device (`fit(ckpt_path=file)`,
`load_from_checkpoint(file)`) and into any strategy that reads full checkpoints.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from strategies.checkpoint_io.atomic_file import atomic_save
from strategies.checkpoint_io.filesystem import is_remote
from strategies.checkpoint_io.sharded.manifest import verified_manifest
from strategies.exceptions import CheckpointLoadError


def _read_folder(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, everything DCP stored) for a committed folder; CheckpointLoadError when it is not one."""
    from torch.distributed.checkpoint.api import CheckpointException

    # What torch's own dcp_to_torch_save uses (a planner that allocates every entry from `.metadata`, and the load
    # that fills the dict it is given), through a reader and planner that run nothing the folder holds.
    from torch.distributed.checkpoint.format_utils import _load_state_dict

    from strategies.checkpoint_io.sharded.safe_read import (
        SafeEmptyStateDictPlanner,
        SafeFileSystemReader,
        SafeFsspecReader,
        dcp_failure,
    )

    reader: Any
    if is_remote(path):
        from strategies.checkpoint_io.sharded.remote import verify_remote

        manifest, problem, folder_url = verify_remote(str(path))
        reader = SafeFsspecReader(folder_url)
    else:
        folder = Path(path)
        if not folder.is_dir():
            kind = "a file" if folder.is_file() else "not there"
            raise CheckpointLoadError(f"{folder} is {kind}: consolidate takes a sharded checkpoint folder "
                                      "(written with sharded_checkpoint=True or 'async').")
        manifest, problem = verified_manifest(folder)
        reader = SafeFileSystemReader(str(folder))
    if manifest is None:
        raise CheckpointLoadError(problem)
    stored: dict[str, Any] = {}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        try:
            _load_state_dict(stored, storage_reader=reader, planner=SafeEmptyStateDictPlanner(), no_dist=True)
        except CheckpointException as err:  # a BaseException: the cause inside
            raise dcp_failure(err, str(path)) from None
    return manifest, stored


def _by_position(state: dict[str, Any]) -> dict[str, Any]:
    """A sharded optimizer state keys parameters by name; the single-file layout by position in the param groups
    (the optimizer's own order, as `optimizer.state_dict()` numbers them)."""
    groups = state.get("param_groups", [])
    names = [name for group in groups for name in group["params"]]
    index = {name: i for i, name in enumerate(names)}
    return {"state": {index[name]: value for name, value in state.get("state", {}).items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in groups]}


def consolidated(path: str | Path) -> dict[str, Any]:
    """The checkpoint dict of the sharded folder at `path`, with whole tensors, in the single-file layout."""
    manifest, stored = _read_folder(path)
    count = int(manifest.pop("optimizer_count", 1))
    manifest.pop("sharded_files", None)
    optim = stored.get("optim", {})
    if len(optim) != count:
        raise CheckpointLoadError(f"{path}: the manifest records {count} optimizer(s), the shards hold {len(optim)}")
    return {**manifest, "state_dict": stored.get("model", {}),
            "optimizer_states": [_by_position(optim[str(i)]) for i in range(count)]}


def consolidate(folder: str | Path, file: str | Path) -> None:
    """Write the sharded checkpoint `folder` as one checkpoint file `file` (atomically)."""
    atomic_save(consolidated(folder), file)
