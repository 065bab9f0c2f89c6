"""The size every tensor storage of a torch archive declares, checked against the record that holds it, before
anything is loaded.

Why: a memory-mapped `torch.load` takes each storage as a slice of the mapped file, as many bytes as the pickle
declares from where its record starts, and skips torch's record-size check. A record shorter than its tensor (an
archive re-zipped, so its CRCs agree) then loaded the zip headers and the next tensor's bytes as weights (nan,
1.7e37), and a longer one loaded cut short. The declared sizes live in the archive's pickle (`data.pkl`), read here
by an unpickler whose every global is an inert stand-in: nothing is imported or run, and only that small entry is
read (no second pass over the tensors).
"""

from __future__ import annotations

import functools
import io
import pickle
import warnings
import zipfile
from collections.abc import Callable
from typing import Any

from strategies.exceptions import CheckpointLoadError

_PICKLE = "data.pkl"


class _Inert:
    """Whatever a global of the pickle names: built, filled and set up without running anything; it keeps what it
    was given, so the error path can say which tensor a storage belongs to."""

    global_name = "?"
    args: tuple[Any, ...]
    items: list[tuple[Any, Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        obj = object.__new__(cls)
        obj.args, obj.items = args, []
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.items.append(("state", state))

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items.append((key, value))

    def append(self, value: Any) -> None:
        self.items.append((len(self.items), value))

    def extend(self, values: Any) -> None:
        for value in values:
            self.append(value)

    def add(self, value: Any) -> None:
        self.append(value)


class _StorageRef:
    """A storage the pickle refers to: its record key and the bytes it declares."""

    def __init__(self, key: str, nbytes: int) -> None:
        self.key, self.nbytes = key, nbytes


@functools.cache
def _inert_class(name: str) -> type[_Inert]:
    return type(name.rpartition(".")[2] or "Global", (_Inert,), {"global_name": name})


@functools.cache
def _element_size(global_name: str) -> int | None:
    """Bytes per element of a pickled storage type (`torch.FloatStorage` -> 4), None when torch has no such type."""
    import torch

    module, _, short = global_name.rpartition(".")
    if module != "torch" or not short.endswith("Storage"):
        return None
    if short == "UntypedStorage":
        return 1
    with warnings.catch_warnings():  # "TypedStorage is deprecated": only its dtype is read
        warnings.simplefilter("ignore")
        dtype = getattr(getattr(torch, short, None), "dtype", None)
    return dtype.itemsize if isinstance(dtype, torch.dtype) else None


class _DeclaredSizes(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data), encoding="utf-8")  # torch.load's encoding
        self.declared: dict[str, list[int]] = {}
        self.problems: list[str] = []

    def find_class(self, module: str, name: str) -> Any:
        return _inert_class(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            self.problems.append(f"a persistent id {pid!r:.80} that is not a storage")
            return None
        _, kind, key, _, numel = pid
        size = _element_size(getattr(kind, "global_name", "?"))
        if size is None or not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            self.problems.append(f"a storage declared as {getattr(kind, 'global_name', kind)!r:.60}, key {key!r:.40}, "
                                 f"{numel!r:.40} elements")
            return None
        self.declared.setdefault(key, []).append(numel * size)
        return _StorageRef(key, numel * size)


def check_record_sizes(entries: list[zipfile.ZipInfo], read: Callable[[zipfile.ZipInfo], bytes]) -> None:
    """Raise CheckpointLoadError when a storage the archive's pickle declares has no record of exactly its size.

    `entries` is the archive's directory (central directory order, torch's), `read` gives an entry's stored bytes.
    An archive without a `data.pkl` under its top folder is left to torch.load (it is not a torch checkpoint).
    """
    if not entries:
        return
    prefix = entries[0].filename.split("/", 1)[0]
    by_name = {info.filename: info for info in entries}
    pickled = by_name.get(f"{prefix}/{_PICKLE}")
    if pickled is None:
        return
    parser = _DeclaredSizes(read(pickled))
    try:
        loaded = parser.load()
    except Exception as err:  # noqa: BLE001 - any malformed pickle: torch's own load would fail on it too
        raise CheckpointLoadError(f"its pickle ({pickled.filename}) is unreadable ({type(err).__name__}: "
                                  f"{str(err)[:120]})") from None
    if parser.problems:
        raise CheckpointLoadError(f"its pickle ({pickled.filename}) holds {parser.problems[0]}")
    for key, sizes in parser.declared.items():
        record = by_name.get(f"{prefix}/data/{key}")
        held = None if record is None else record.file_size
        wrong = [size for size in sizes if size != held]
        if wrong:
            where = _tensor_paths(loaded, key)
            what = f" ({', '.join(where[:3])}{', ...' if len(where) > 3 else ''})" if where else ""
            found = "is missing" if record is None else f"holds {held} bytes"
            raise CheckpointLoadError(
                f"the tensor storage '{key}'{what} declares {wrong[0]} bytes, but its record "
                f"'{prefix}/data/{key}' {found}: the archive was rebuilt or tampered with")


def _children(value: Any, where: str) -> list[tuple[Any, str]]:
    """The values inside `value`, each with its key path; a tensor's rebuild arguments keep the tensor's path."""
    if isinstance(value, dict):
        return [(item, f"{where}[{name!r}]") for name, item in value.items()]
    if isinstance(value, list):
        return [(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, tuple):
        return [(item, where) for item in value]
    if isinstance(value, _Inert):
        return [(item, where) for item in value.args] + [(item, f"{where}[{name!r}]") for name, item in value.items]
    return []


def _tensor_paths(loaded: Any, key: str) -> list[str]:
    """The key paths (e.g. checkpoint['state_dict']['w']) of the tensors built on storage `key` (error path only)."""
    found: list[str] = []
    pending: list[tuple[Any, str, int]] = [(loaded, "checkpoint", 0)]
    while pending and len(found) < 4:
        value, where, depth = pending.pop()
        if isinstance(value, _StorageRef):
            if value.key == key and where not in found:
                found.append(where)
        elif depth < 64:
            pending.extend((item, path, depth + 1) for item, path in reversed(_children(value, where)))
    return found
