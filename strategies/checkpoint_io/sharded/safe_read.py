"""Reading a sharded folder with DCP without letting the folder run code, after its manifest was verified.

Why: DCP reads `.metadata` with plain `pickle.load` and every non-tensor value of the shards with
`torch.load(weights_only=False)`, so a folder is code. The manifest's sha256s only prove that the files are the ones
the manifest lists, and a folder made by an attacker has a manifest of its own. So, whatever the manifest says:

- `.metadata` is read by an unpickler that knows DCP's metadata classes, torch dtypes, layouts and sizes, and paths,
  and refuses any other global (`read_metadata`);
- the metadata may name only the shard files the manifest lists, byte ranges inside them, no stream transforms, and
  no more tensor bytes than those files hold (`metadata_problem`);
- the shards' non-tensor values are read with `torch.load(weights_only=True)` (`SafeLoadPlanner`); tensors already
  are, by DCP itself.

Imports DCP (about a second): imported by the functions that read a folder, never with `import trainer`.
"""

from __future__ import annotations

import io
import math
import pickle
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import _StorageInfo

from strategies.checkpoint_io.safe_load import load_cause
from strategies.exceptions import CheckpointLoadError

METADATA = ".metadata"
_DCP_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name): getattr(dcp_metadata, name)
    for name in ("Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
                 "BytesStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
}
_ALLOWED: dict[tuple[str, str], Any] = {
    **_DCP_CLASSES,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): _StorageInfo,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,  # a layout by its name
    ("pathlib", "PosixPath"): __import__("pathlib").PurePosixPath,  # the save's checkpoint_id: a name, never opened
    ("pathlib", "PurePosixPath"): __import__("pathlib").PurePosixPath,
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None and module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            found = getattr(torch, name)
        if found is None:
            raise pickle.UnpicklingError(f"it names the global {module}.{name}, which DCP metadata never holds")
        return found


def read_metadata(raw: bytes, label: str) -> Any:
    """The DCP `Metadata` in `raw` (a `.metadata` file's bytes), rebuilt from allowlisted classes only."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(raw)).load()
    except Exception as err:  # noqa: BLE001 - any malformed or refused pickle
        raise CheckpointLoadError(f"{label}: its {METADATA} was refused without running it: "
                                  f"{type(err).__name__}: {str(err)[:200]}") from None
    if not isinstance(metadata, dcp_metadata.Metadata) or not isinstance(metadata.storage_data, dict):
        raise CheckpointLoadError(f"{label}: its {METADATA} holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


def metadata_problem(metadata: Any, sizes: dict[str, int]) -> str | None:
    """Why the metadata must not be followed, given the listed shard files and their sizes, or None."""
    for index, info in metadata.storage_data.items():
        if not isinstance(info, _StorageInfo) or not isinstance(index, dcp_metadata.MetadataIndex):
            return f"its {METADATA} has a storage entry of type {type(info).__name__}"
        name, offset, length = info.relative_path, info.offset, info.length
        if not isinstance(name, str) or name not in sizes or name == METADATA:
            return f"its {METADATA} points {index.fqn!r:.80} at {name!r:.80}, which the manifest does not list"
        if not (isinstance(offset, int) and isinstance(length, int) and 0 <= offset and 0 <= length
                and offset + length <= sizes[name]):
            return (f"its {METADATA} points {index.fqn!r:.80} at bytes {offset!r:.20}+{length!r:.20} of {name}, "
                    f"which holds {sizes[name]} bytes")
        if info.transform_descriptors:
            return f"its {METADATA} asks for stream transforms {info.transform_descriptors!r:.80}, never written here"
    held = sum(sizes[name] for name in sizes if name != METADATA)
    declared = 0
    for fqn, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, dcp_metadata.TensorStorageMetadata):
            itemsize = entry.properties.dtype.itemsize if isinstance(entry.properties.dtype, torch.dtype) else 1
            declared += sum(math.prod(chunk.sizes) for chunk in entry.chunks) * itemsize
        elif not isinstance(entry, dcp_metadata.BytesStorageMetadata):
            return f"its {METADATA} describes {fqn!r:.80} as a {type(entry).__name__}"
    if declared > held:
        return f"its {METADATA} declares {declared} bytes of tensors, but its shard files hold {held} bytes"
    return None


class SafeFileSystemReader(FileSystemReader):
    """DCP's local reader, with `.metadata` read by the allowlisting unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        with self.fs.create_stream(self._get_metadata_path(kwargs.get("rank")), "rb") as stream:
            metadata = read_metadata(stream.read(), str(self.path))
        if metadata.storage_meta is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeFsspecReader(FsspecReader):
    """DCP's fsspec reader, with `.metadata` read by the allowlisting unpickler."""

    read_metadata = SafeFileSystemReader.read_metadata


class _WeightsOnlyValues:
    """A load planner's `load_bytes` with `torch.load(weights_only=True)` (DCP's own uses weights_only=False)."""

    flatten_state_dict: bool
    mappings: Any
    original_state_dict: Any
    state_dict: Any

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            with warnings.catch_warnings():  # torch's note on an unusual pickle protocol: the refusal says enough
                warnings.simplefilter("ignore")
                loaded = torch.load(value, weights_only=True)
        except Exception as err:  # noqa: BLE001 - refused or damaged: named, never loaded unsafely
            raise CheckpointLoadError(f"the stored value {fqn!r} was refused by the safe (weights-only) loader: "
                                      f"{load_cause(err)}; it is never loaded unsafely") from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


class SafeLoadPlanner(_WeightsOnlyValues, DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor values weights-only."""


class SafeEmptyStateDictPlanner(_WeightsOnlyValues, _EmptyStateDictLoadPlanner):
    """The planner that rebuilds every entry from the metadata (consolidation), reading non-tensor values
    weights-only."""


def dcp_failure(err: BaseException, label: str) -> CheckpointLoadError:
    """A DCP CheckpointException (a BaseException holding each rank's error) as one CheckpointLoadError naming the
    folder and the first cause."""
    failures = getattr(err, "failures", None) or {}
    causes = [pair[0] if isinstance(pair, tuple) else pair for pair in failures.values()]
    cause = next((c for c in causes if isinstance(c, CheckpointLoadError)), causes[0] if causes else err)
    text = str(cause) if isinstance(cause, CheckpointLoadError) else f"{type(cause).__name__}: {str(cause)[:300]}"
    return CheckpointLoadError(f"{label}: the sharded checkpoint could not be read: {text}")
