"""What `torch.load(weights_only=True)` accepts, asked of torch itself, and how a foreign file whose pickle names
classes torch refuses is read without running any of them.

Why: a checkpoint is only worth writing if our own safe loader can read it back, so the writer refuses, at save
time and naming the key, what the loader would refuse. The rule is torch's, not a list of ours: torch's default
allowlist (`collections.Counter`, `OrderedDict`, `set`, dtypes, ...) plus whatever the user registered with
`torch.serialization.add_safe_globals` (or the `safe_globals` context). A list of our own refused torch's own
`MultiStepLR` state (its milestones are a `Counter`).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch.serialization import get_safe_globals, safe_globals

__all__ = ["LIGHTNING_DICTS", "LIGHTNING_MARKER", "StandIn", "allowed_globals", "contains_stand_ins",
           "load_with_stand_ins", "pickle_mentions", "refusal"]

# Exact types the pickle opcodes hold by value (no global is looked up for them).
_BY_VALUE = frozenset({str, bytes, int, float, bool, type(None)})
# torch values whose reduction names only allowlisted globals (dtypes, torch.device, torch.Size, layouts).
_LEAVES = (torch.Tensor, torch.dtype, torch.device, torch.Size, torch.layout)
# Lightning's dict subclasses in its checkpoints' hyperparameters: read as plain dicts (their items load as usual).
LIGHTNING_MARKER = b"pytorch-lightning_version"
LIGHTNING_DICTS = {name: dict for name in (
    "lightning.fabric.utilities.data.AttributeDict", "lightning_fabric.utilities.data.AttributeDict",
    "lightning.pytorch.utilities.parsing.AttributeDict", "pytorch_lightning.utilities.parsing.AttributeDict")}


def allowed_globals() -> dict[int, Any]:
    """The classes and functions a weights-only load may rebuild, by id: torch's defaults plus user additions."""
    from torch import _weights_only_unpickler as unpickler  # private, but it is the loader's own table

    # getattr: a torch that renames these still has the public get_safe_globals() below
    found: list[Any] = list(getattr(unpickler, "_get_allowed_globals", dict)().values())
    found += list(getattr(unpickler, "_get_user_allowed_globals", dict)().values())
    found += [entry[0] if isinstance(entry, tuple) else entry for entry in get_safe_globals()]
    return {id(obj): obj for obj in found}


def _global_name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def refusal(value: Any, path: str = "checkpoint", allowed: dict[int, Any] | None = None) -> str | None:
    """Why a weights-only load would refuse `value` (naming the key path and the global), or None if it loads.

    Tensors are torch's own business (their rebuild functions are allowlisted); containers are walked; any
    other object is allowed when its class (or, for a class or function stored as a value, the object itself)
    is on torch's allowlist, and then its contents are walked too.
    """
    found = _find(value, allowed_globals() if allowed is None else allowed)
    if found is None:
        return None
    keys, what = found
    return f"{path}{''.join(reversed(keys))} holds {what}"


def _find(value: Any, allowed: dict[int, Any]) -> tuple[list[str], str] | None:
    """(the key path, innermost first, and what is refused there) or None; the path is built only on failure."""
    kind = type(value)
    if kind in _BY_VALUE or isinstance(value, _LEAVES):
        return None
    if kind is dict or kind is list or kind is tuple:
        return _find_in_items(value, allowed)
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):  # pickled by reference
        if id(value) in allowed:
            return None
        return [], f"{_global_name(value)} (a {'class' if isinstance(value, type) else 'function'})"
    if id(kind) not in allowed:
        return [], f"a {_global_name(kind)}"
    if not isinstance(value, (Mapping, list, tuple, set)):
        state = getattr(value, "__dict__", None)  # an allowlisted class is rebuilt from its __dict__ (pickle's BUILD)
        return _find_in_items(state, allowed) if isinstance(state, dict) else None
    return _find_in_items(value, allowed)


def _find_in_items(value: Any, allowed: dict[int, Any]) -> tuple[list[str], str] | None:
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _find(key, allowed)
            if found is not None:
                return [f" key {key!r}"], found[1]
            found = _find(item, allowed)
            if found is not None:
                found[0].append(f"[{key!r}]")
                return found
        return None
    for idx, item in enumerate(value):
        found = _find(item, allowed)
        if found is not None:
            found[0].append(f"[{idx}]")
            return found
    return None


class StandIn:
    """Stands in for a class or function a weights-only load refuses, in a file we read but did not write.

    The pickle then rebuilds this class instead: it records the name and the arguments, and runs none of the
    original's code (nothing is imported). Code that reads the loaded dict finds these and reports them.
    """

    global_name: ClassVar[str] = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:
        obj = super().__new__(cls)
        obj.args = args
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.global_name}, not loaded>"


def _stand_in_for(name: str) -> type[StandIn]:
    return type(name.rsplit(".", 1)[-1], (StandIn,), {"global_name": name, "__module__": __name__})


def contains_stand_ins(value: Any) -> list[str]:
    """The global names of the stand-ins (instances or classes) anywhere inside `value`."""
    found: list[str] = []

    def walk(item: Any) -> None:
        if isinstance(item, StandIn) or isinstance(item, type) and issubclass(item, StandIn):
            found.append(item.global_name)
        elif isinstance(item, Mapping):
            for part in item.values():
                walk(part)
        elif isinstance(item, (list, tuple, set)):
            for part in item:
                walk(part)

    walk(value)
    return sorted(set(found))


def _unsafe_globals(source: Path | bytes) -> list[str]:
    handle: Any = io.BytesIO(source) if isinstance(source, bytes) else source
    return list(torch.serialization.get_unsafe_globals_in_checkpoint(handle))


def pickle_mentions(source: Path | bytes, marker: bytes) -> bool:
    """Whether the archive's pickle (not its tensor data) contains `marker`; reads that one entry only."""
    try:
        with zipfile.ZipFile(io.BytesIO(source) if isinstance(source, bytes) else source) as archive:
            names = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            return bool(names) and marker in archive.read(names[0])
    except (zipfile.BadZipFile, OSError, KeyError):
        return False


def load_with_stand_ins(source: Path | bytes, map_location: Any, mapped: Mapping[str, Any] | None = None,
                        limit: int = 256) -> Any:
    """`torch.load(weights_only=True)` where each global the loader refuses is rebuilt as a `StandIn`.

    `mapped` names globals to replace by a given allowlisted object instead (e.g. a dict subclass by `dict`).
    Still torch's weights-only unpickler: only these stand-ins are added to its allowlist, for this load.
    """
    names = _unsafe_globals(source)[:limit]
    mapped = mapped or {}
    entries: list[Any] = [(mapped.get(name) or _stand_in_for(name), name) for name in names]
    with safe_globals(entries):
        handle: Any = io.BytesIO(source) if isinstance(source, bytes) else source
        return torch.load(handle, map_location=map_location, weights_only=True)
