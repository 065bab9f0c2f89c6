"""The manifest of a sharded checkpoint folder: what it records (the non-sharded state and every shard file's
sha256) and the check that a folder matches it, run before DCP reads anything (DCP unpickles `.metadata`).

What is verified, in this order, before DCP opens the folder (docs/zero.md lists it for users):
1. `manifest.pt` exists and loads weights-only; it is a dict with a known `format_version`, an int
   `optimizer_count` and `sharded_files`, a non-empty mapping of plain file names to sha256s that lists `.metadata`;
2. the folder holds exactly those files and the manifest: an unlisted file (a shard dropped from the manifest), a
   missing one or a sub-folder is refused;
3. every file matches its sha256 (on a store: its ETag, or sha256);
4. `.metadata` is read by an allowlisting unpickler, never run, and may name only listed shard files, byte ranges
   inside them and no more tensor bytes than they hold (strategies/checkpoint_io/sharded/safe_read.py).
DCP then reads the shards' non-tensor values weights-only, as the tensors already are.
"""

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
METADATA = ".metadata"  # DCP's metadata file
SHARDED_KEYS = ("state_dict", "optimizer_states")
# The checkpoint format versions whose sharded folders this release reads: trainer/checkpoint/schema.py's
# FORMAT_VERSION and the ones before it (a test keeps them in step; strategies/ does not import trainer/).
READABLE_FORMAT_VERSIONS = (1,)


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


def manifest_problem(manifest: Any) -> str | None:
    """Why a loaded manifest is not one this release follows (step 1 of the module docstring), or None."""
    if not isinstance(manifest, dict):
        return f"its {MANIFEST} holds a {type(manifest).__name__}, not a manifest"
    version = manifest.get("format_version")
    if type(version) is not int or version not in READABLE_FORMAT_VERSIONS:
        return (f"its {MANIFEST} has format_version {version!r:.40}; this release reads "
                f"{', '.join(map(str, READABLE_FORMAT_VERSIONS))} (a newer trainer wrote it, or it is not a manifest)")
    count = manifest.get("optimizer_count")
    if type(count) is not int or count < 0:
        return f"its {MANIFEST} has optimizer_count {count!r:.40}, not a count"
    files = manifest.get("sharded_files")
    if not isinstance(files, dict) or not files:
        return f"its {MANIFEST} lists no shard files ('sharded_files'), so nothing in the folder can be verified"
    for name, digest in files.items():
        if not isinstance(name, str) or not isinstance(digest, str) or name in ("", ".", "..", MANIFEST) \
                or "/" in name or "\\" in name:
            return f"its {MANIFEST} lists {name!r:.80}, which is not a shard file name of the folder"
    if METADATA not in files:
        return f"its {MANIFEST} does not list DCP's {METADATA}, so it cannot be verified before it is read"
    return None


def listing_problem(files: dict[str, str], present: dict[str, int | None]) -> str | None:
    """Why the folder's files (name -> size, None for a sub-folder) do not match the manifest's list, or None."""
    for name, size in sorted(present.items()):
        if name == MANIFEST:
            continue
        if size is None:
            return f"it holds the sub-folder {name!r}, which a sharded checkpoint never has"
        if name not in files:
            return f"it holds {name!r}, which its manifest does not list (a file added, or dropped from the manifest)"
    missing = sorted(set(files) - set(present))
    return f"it is missing the shard file {missing[0]}" if missing else None


def verified_manifest(folder: Path) -> tuple[dict[str, Any] | None, str]:
    """(the manifest, "") when the local folder passes every check of the module docstring, else (None, why not)."""
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return None, (f"{folder} has no {MANIFEST}: it is not a committed checkpoint of this trainer "
                      "(or its save was cut short)")
    try:
        manifest = safe_load(manifest_path)
    except CheckpointLoadError as err:
        return None, str(err)
    problem = manifest_problem(manifest)
    if problem is None:
        present = {p.name: None if p.is_dir() else p.stat().st_size for p in folder.iterdir()}
        problem = listing_problem(manifest["sharded_files"], present)
    for name, digest in manifest["sharded_files"].items() if problem is None else ():
        if sha256_of(folder / name) != digest:
            problem = f"{name} does not match the sha256 in its manifest (changed or damaged)"
            break
    if problem is None:
        problem = metadata_check((folder / METADATA).read_bytes(), present, str(folder))
    if problem is not None:
        return None, f"{folder} was refused before anything in it was unpickled: {problem}"
    return manifest, ""


def metadata_check(raw: bytes, present: dict[str, int | None], label: str) -> str | None:
    """Step 4: `.metadata` read without running it, and what it points at (safe_read.py imports DCP: here, late)."""
    from strategies.checkpoint_io.sharded.safe_read import metadata_problem, read_metadata

    try:
        metadata = read_metadata(raw, label)
    except CheckpointLoadError as err:
        return str(err).removeprefix(f"{label}: ")
    return metadata_problem(metadata, {name: size for name, size in present.items()
                                       if size is not None and name != MANIFEST})


def verify_folder(folder: Path) -> str | None:
    """Why a local sharded checkpoint folder cannot be loaded, or None when every shard matches its manifest."""
    manifest, problem = verified_manifest(folder)
    return None if manifest is not None else problem
