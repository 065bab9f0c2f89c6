"""Moving a (nested) batch to a device: the default of `Strategy.batch_to_device` and of the module's
`transfer_batch_to_device`, also used to bring predictions back to the host. And whether a module is already on a
device, so that set-up can skip moving it."""

from __future__ import annotations

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


def module_on(module: nn.Module, device: torch.device) -> bool:
    """Whether `module.to(device)` would change nothing (it still walks and re-assigns every tensor): every parameter
    and buffer is already on `device`, and no submodule has an `_apply` of its own, which may move more than those
    (torchmetrics' metrics move their states in theirs)."""
    return (all(type(m)._apply is nn.Module._apply for m in module.modules())
            and all(t.device == device for t in module.parameters())
            and all(t.device == device for t in module.buffers()))
