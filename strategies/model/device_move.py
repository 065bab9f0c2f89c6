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
    if isinstance(batch, Tensor):
        # `device == _CPU`, not `device.type == "cpu"`: reading `.type` builds a new string (about 0.4 us, per tensor
        # of every batch), a comparison does not.
        if batch.is_cpu if device == _CPU else batch.device == device:
            return batch
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, (list, tuple)):
        moved, changed, to_cpu = [], False, device == _CPU
        for item in batch:
            # a tensor already on the device, the common item, is checked here without a recursive call
            on_device = type(item) is Tensor and (item.is_cpu if to_cpu else item.device == device)
            new = item if on_device else move_to_device(item, device)
            changed = changed or new is not item
            moved.append(new)
        if not changed:
            return batch
        if hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*moved)
        return type(batch)(moved) if isinstance(batch, list) else tuple(moved)
    if isinstance(batch, Mapping):
        return type(batch)({k: move_to_device(v, device) for k, v in batch.items()}) if isinstance(
            batch, dict
        ) else {k: move_to_device(v, device) for k, v in batch.items()}
    to = getattr(batch, "to", None)
    if callable(to) and not isinstance(batch, nn.Module):
        return to(device)
    return batch


def module_on(module: nn.Module, device: torch.device) -> bool:
    """Whether `module.to(device)` would change nothing (it still walks and re-assigns every tensor): every parameter
    and buffer is already on `device`, and no submodule has an `_apply` of its own, which may move more than those
    (torchmetrics' metrics move their states in theirs)."""
    return (all(type(m)._apply is nn.Module._apply for m in module.modules())
            and all(t.device == device for t in module.parameters())
            and all(t.device == device for t in module.buffers()))
