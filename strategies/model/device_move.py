"""Moving a (nested) batch to a device: the default of `Strategy.batch_to_device` and of the module's
`transfer_batch_to_device`, also used to bring predictions back to the host. And whether a module is already on a
device, so that set-up can skip moving it."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

_CPU = torch.device("cpu")


def move_to_device(batch: Any, device: torch.device) -> Any:
    """Recursively move tensors in (nested) lists, tuples, namedtuples and dicts to `device`.

    Containers whose tensors are already there come back as the same object (no per-step rebuild).
    """
    # `device == _CPU`, not `device.type == "cpu"`: reading `.type` builds a new string (about 0.4 us, per tensor of
    # every batch), a comparison does not.
    cls = type(batch)
    if cls is list or cls is tuple:  # the common batch, (x, y) already on the device: checked without a call
        to_cpu = device == _CPU
        for item in batch:
            if type(item) is not Tensor or not (item.is_cpu if to_cpu else item.device == device):
                break
        else:
            return batch
    if isinstance(batch, Tensor):
        if batch.is_cpu if device == _CPU else batch.device == device:
            return batch
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, (list, tuple)):
        return _move_sequence(batch, device)
    if isinstance(batch, Mapping):
        return type(batch)({k: move_to_device(v, device) for k, v in batch.items()}) if isinstance(
            batch, dict
        ) else {k: move_to_device(v, device) for k, v in batch.items()}
    to = getattr(batch, "to", None)
    if callable(to) and not isinstance(batch, nn.Module):
        return to(device)
    return batch


def _move_sequence(batch: list[Any] | tuple[Any, ...], device: torch.device) -> Any:
    """A list, tuple or namedtuple with its items moved; the same object when none changed."""
    moved = [move_to_device(item, device) for item in batch]
    if all(new is old for new, old in zip(moved, batch, strict=True)):
        return batch
    if hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*moved)
    return type(batch)(moved) if isinstance(batch, list) else tuple(moved)


def move_data_to_device(batch: Any, device: torch.device | str | int) -> Any:
    """`move_to_device` under Lightning's name, taking the device as Lightning does: a `torch.device`, a string
    ("cuda:1") or a CUDA index."""
    return move_to_device(batch, device if isinstance(device, torch.device) else torch.device(device))


def recursive_detach(data: Any, to_cpu: bool = False) -> Any:
    """`data` with every tensor in its dicts, lists and tuples detached from the graph (and copied to the CPU with
    `to_cpu`), for keeping step outputs without keeping their graphs alive."""
    if isinstance(data, Tensor):
        data = data.detach()
        return data.cpu() if to_cpu else data
    if isinstance(data, dict):  # a copy keeps the dict's own type (OrderedDict, defaultdict's factory)
        out = copy.copy(data)
        for key, value in data.items():
            out[key] = recursive_detach(value, to_cpu)
        return out
    if isinstance(data, Mapping):
        return {k: recursive_detach(v, to_cpu) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        items = [recursive_detach(v, to_cpu) for v in data]
        if hasattr(data, "_fields"):  # namedtuple
            return type(data)(*items)
        return type(data)(items) if isinstance(data, list) else tuple(items)
    return data


def module_on(module: nn.Module, device: torch.device) -> bool:
    """Whether `module.to(device)` would change nothing (it still walks and re-assigns every tensor): every parameter
    and buffer is already on `device`, and no submodule has an `_apply` of its own, which may move more than those
    (torchmetrics' metrics move their states in theirs)."""
    return (all(type(m)._apply is nn.Module._apply for m in module.modules())
            and all(t.device == device for t in module.parameters())
            and all(t.device == device for t in module.buffers()))
