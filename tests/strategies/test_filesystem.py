"""Remote paths: URL handling, clear errors for unknown protocols and missing packages, and the commit-record
protocol of strategies/checkpoint_io/object_store.py on the memory:// filesystem (a real fsspec filesystem, in
process)."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest
import torch

from callbacks import ModelCheckpoint
from strategies.checkpoint_io.atomic_file import atomic_save, object_store, remove_stale_temp_files
from strategies.checkpoint_io.catalog import find_checkpoints, remove_checkpoint
from strategies.checkpoint_io.filesystem import is_remote, join, parent, to_path
from strategies.checkpoint_io.safe_load import safe_load
from strategies.exceptions import CheckpointLoadError, CheckpointSaveError, ConfigError
from tests.helpers.owners import dead_owner_tag
from trainer import Trainer


def _inner(url: str) -> str:
    return fsspec.core.url_to_fs(url)[1]


def test_local_paths_stay_paths_and_urls_stay_strings():
    assert to_path("runs/a") == Path("runs/a")
    assert to_path("file:///tmp/x") == Path("/tmp/x")
    assert to_path("memory://bucket/run/") == "memory://bucket/run"
    assert not is_remote(Path("s3:/bucket")) and is_remote("memory://x") and not is_remote("file:///x")
    assert join("memory://a", "b", "c.ckpt") == "memory://a/b/c.ckpt"
    assert parent("memory://a/b/c.ckpt") == "memory://a/b"


def test_unknown_protocol_is_a_clear_error_at_construction():
    with pytest.raises(ConfigError, match=r"no filesystem is known for the protocol 'nosuch://'"):
        Trainer(default_root_dir="nosuch://bucket/run")
    with pytest.raises(ConfigError, match="nosuch"):
        ModelCheckpoint(dirpath="nosuch://bucket/ckpts")


def test_missing_package_names_what_to_install():
    # gcsfs is not a dependency of this project: fsspec knows gs:// but cannot import its implementation
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("gcsfs is installed here")
    with pytest.raises(ConfigError, match=r"'gs://b/run' needs the package behind 'gs://': pip install gcsfs"):
        Trainer(default_root_dir="gs://b/run")


def _state(version: int) -> dict:
    return {"format_version": 1, "version": version, "w": torch.full((4, 4), float(version))}


def test_save_writes_data_then_a_commit_record(memory_root):
    path = f"{memory_root}/ck/model.ckpt"
    atomic_save(_state(1), path)
    fs = fsspec.filesystem("memory")
    record = object_store.parse_record(fs.cat_file(_inner(path)))
    assert record is not None and record["kind"] == "file"
    assert fs.exists(_inner(f"{memory_root}/ck/{record['data']}"))
    assert safe_load(path)["version"] == 1


def test_overwrite_keeps_one_data_object_and_loads_the_new_one(memory_root):
    path = f"{memory_root}/ck/model.ckpt"
    atomic_save(_state(1), path)
    atomic_save(_state(2), path)
    names = sorted(p.rsplit("/", 1)[1] for p in fsspec.filesystem("memory").find(_inner(f"{memory_root}/ck")))
    assert names[0] == "model.ckpt" and len(names) == 2 and names[1].startswith("model.ckpt.data-")
    assert safe_load(path)["version"] == 2


def test_uncommitted_data_is_ignored_and_cleaned(memory_root):
    folder = f"{memory_root}/ck"
    atomic_save(_state(1), f"{folder}/a.ckpt")
    fs = fsspec.filesystem("memory")
    dead = f"b.ckpt.data-{dead_owner_tag()}"
    fs.pipe_file(_inner(f"{folder}/{dead}"), b"half a checkpoint")  # a save that died
    assert [p for _, p in find_checkpoints(folder)] == [fs.unstrip_protocol(_inner(f"{folder}/a.ckpt"))]
    removed = remove_stale_temp_files(folder)
    assert [r.rsplit("/", 1)[1] for r in removed] == [dead]
    assert safe_load(f"{folder}/a.ckpt")["version"] == 1


def test_a_plain_object_loads_when_named_but_is_not_a_committed_checkpoint(memory_root):
    folder = f"{memory_root}/up"
    with fsspec.open(f"{folder}/uploaded.ckpt", "wb") as handle:  # e.g. copied with the store's own tools
        torch.save(_state(7), handle)
    assert safe_load(f"{folder}/uploaded.ckpt")["version"] == 7
    assert find_checkpoints(folder) == []


def test_damaged_or_missing_data_is_a_clear_error(memory_root):
    path = f"{memory_root}/ck/model.ckpt"
    atomic_save(_state(1), path)
    fs = fsspec.filesystem("memory")
    data = object_store.parse_record(fs.cat_file(_inner(path)))["data"]
    fs.pipe_file(_inner(f"{memory_root}/ck/{data}"), fs.cat_file(_inner(f"{memory_root}/ck/{data}"))[:-10])
    with pytest.raises(CheckpointLoadError, match=r"truncated or corrupted\): its data holds"):
        safe_load(path)
    fs.rm(_inner(f"{memory_root}/ck/{data}"))
    with pytest.raises(CheckpointLoadError, match="is committed, but its data .* is missing"):
        safe_load(path)
    with pytest.raises(CheckpointLoadError, match="does not exist"):
        safe_load(f"{memory_root}/ck/nope.ckpt")


def test_remove_deletes_record_and_data(memory_root):
    path = f"{memory_root}/ck/model.ckpt"
    atomic_save(_state(1), path)
    remove_checkpoint(path)
    assert fsspec.filesystem("memory").find(_inner(f"{memory_root}/ck")) == []


def test_a_failed_write_leaves_the_previous_checkpoint(memory_root):
    path = f"{memory_root}/ck/model.ckpt"
    atomic_save(_state(1), path)

    def broken(obj, handle):
        handle.write(b"partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(CheckpointSaveError, match="the previous checkpoint, if any, is untouched"):
        atomic_save(_state(2), path, write=broken)
    assert safe_load(path)["version"] == 1
    assert len(fsspec.filesystem("memory").find(_inner(f"{memory_root}/ck"))) == 2  # record + its data only
