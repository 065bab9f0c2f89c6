"""Sharded (ZeRO-2/3) checkpoints on a remote store: DCP's fsspec writer, then our manifest, then the commit record.

The layout follows strategies/checkpoint_io/object_store.py: every rank writes its shards under a new prefix
`<name>.ckpt.data-<token>/`, rank 0 adds the manifest (the non-sharded state and a fingerprint of every shard
file) and then writes the commit record `<name>.ckpt` naming that prefix. A folder is verified before DCP reads
anything from it (DCP unpickles `.metadata`), as locally. A fingerprint is the store's ETag where it gives one
(no second download of the shards), else a sha256 of the bytes.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
from typing import Any

import torch

from strategies.checkpoint_io import object_store
from strategies.checkpoint_io.filesystem import get_fs
from strategies.checkpoint_io.safe_load import safe_load
from strategies.checkpoint_io.sharded.manifest import (
    MANIFEST,
    METADATA,
    SaveJob,
    listing_problem,
    manifest_problem,
    manifest_state,
    metadata_check,
)
from strategies.checkpoint_io.temp_owner import owner_tag
from strategies.exceptions import CheckpointLoadError, CheckpointSaveError


def _fingerprint(fs: Any, path: str, info: dict[str, Any]) -> str:
    etag = info.get("ETag") or info.get("etag")
    if etag:
        return f"etag:{str(etag).strip(chr(34))}"
    return hashlib.sha256(fs.cat_file(path)).hexdigest()


def _matches(fs: Any, path: str, info: dict[str, Any], expected: str) -> bool:
    if expected.startswith("etag:"):
        return _fingerprint(fs, path, info) == expected
    return hashlib.sha256(fs.cat_file(path)).hexdigest() == expected  # a folder uploaded from a local save


def remote_job(strategy: Any, url: str) -> SaveJob:
    """Where every rank writes its shards (a new data prefix, named after rank 0), and rank 0's commit."""
    fs, path = get_fs(url)
    folder, base = posixpath.split(path)
    data_name = f"{base}{object_store.DATA_MARKER}{strategy.broadcast(owner_tag())}"  # rank 0 owns it
    data_path = posixpath.join(folder, data_name)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    def commit(checkpoint: dict[str, Any]) -> str | None:
        try:
            _commit(fs, path, data_path, data_name, checkpoint)
        except Exception as err:  # noqa: BLE001 - any store error; the old record still names the old data
            return (f"could not commit {url}: {type(err).__name__}: {err}; the previous checkpoint, if any, "
                    "is untouched")
        return None

    # an object is durable once closed: no fsync (which fsspec files do not have)
    return SaveJob(url, {"storage_writer": FsspecWriter(fs.unstrip_protocol(data_path), sync_files=False)}, commit)


def _commit(fs: Any, path: str, data_path: str, data_name: str, checkpoint: dict[str, Any]) -> None:
    fs.invalidate_cache(data_path)
    entries = fs.ls(data_path, detail=True)
    files = {posixpath.basename(e["name"]): _fingerprint(fs, e["name"], e) for e in entries if e["type"] == "file"}
    if not files:
        raise CheckpointSaveError(f"no shard files were found under {data_path}")
    buffer = io.BytesIO()
    torch.save(manifest_state(checkpoint, files), buffer)
    fs.pipe_file(posixpath.join(data_path, MANIFEST), buffer.getvalue())
    previous = object_store.commit(fs, path, data_name, "folder", len(files))
    object_store.remove_data(fs, posixpath.dirname(path), previous)


def verify_remote(url: str) -> tuple[dict[str, Any] | None, str, str]:
    """(manifest or None, the problem, the data folder URL) for a sharded checkpoint on a store."""
    try:
        fs, data_path, record = object_store.resolve(url)
    except CheckpointLoadError as err:
        return None, str(err), url
    folder_url = fs.unstrip_protocol(data_path)
    if record is not None and record.get("kind") != "folder":
        return None, f"{url} is a single-file checkpoint, not a sharded folder", folder_url
    fs.invalidate_cache(data_path)
    try:
        infos = {posixpath.basename(e["name"]): e for e in fs.ls(data_path, detail=True)}
    except FileNotFoundError:
        infos = {}
    if record is not None and not infos:
        return None, str(object_store.missing_data(url, record)), folder_url
    if MANIFEST not in infos:
        return None, (f"{url} has no {MANIFEST}: it is not a committed checkpoint of this trainer "
                      "(or its save was cut short)"), folder_url
    try:
        manifest = safe_load(posixpath.join(folder_url, MANIFEST))
    except CheckpointLoadError as err:
        return None, str(err), folder_url
    problem = _problem(fs, manifest, infos, url)
    if problem is not None:
        return None, f"{url} was refused before anything in it was unpickled: {problem}", folder_url
    return manifest, "", folder_url


def _problem(fs: Any, manifest: Any, infos: dict[str, Any], url: str) -> str | None:
    """Steps 1-4 of strategies/checkpoint_io/sharded/manifest.py on a store's listing (`infos`, by name)."""
    present = {name: None if info.get("type") == "directory" else int(info.get("size") or 0)
               for name, info in infos.items()}
    problem = manifest_problem(manifest) or listing_problem(manifest["sharded_files"], present)
    if problem is not None:
        return problem
    for name, expected in manifest["sharded_files"].items():
        if not _matches(fs, infos[name]["name"], infos[name], str(expected)):
            return f"{name} does not match the fingerprint in its manifest (changed or damaged)"
    return metadata_check(fs.cat_file(infos[METADATA]["name"]), present, url)
