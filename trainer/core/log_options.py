"""The `self.log` options Lightning has that need a check here: callables for `reduce_fx` mapped to their names,
and the options this project does not support refused by name (nothing a user passes is silently ignored)."""

from __future__ import annotations

from typing import Any

import torch

from strategies.exceptions import MisconfigurationError

REDUCE_FX_NAMES: dict[Any, str] = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min",
                                   sum: "sum", max: "max", min: "min"}


def reduce_fx_name(reduce_fx: Any) -> str:
    """The name of a `reduce_fx`, as Lightning reads it: a string in any case (`"avg"` is the mean), a torch function
    or Python's `sum`, `max`, `min` by its name (anything else shows its repr in the error that names the accepted
    values)."""
    if isinstance(reduce_fx, str):
        name = reduce_fx.lower()
        return "mean" if name == "avg" else name
    return REDUCE_FX_NAMES.get(reduce_fx, repr(reduce_fx))


def check_log_options(name: str, enable_graph: bool, sync_dist: bool, sync_dist_group: Any,
                       add_dataloader_idx: bool, rank_zero_only: bool) -> None:
    """Refuse, by name, the `self.log` options that would otherwise do nothing here."""
    if enable_graph:
        raise MisconfigurationError(
            f"self.log({name!r}, enable_graph=True) is not supported: logged values are detached. Log the value "
            "and keep your own reference to the tensor if you need its graph."
        )
    if sync_dist_group is not None:
        raise MisconfigurationError(
            f"self.log({name!r}, sync_dist_group=...) is not supported: sync_dist reduces over all ranks."
        )
    if rank_zero_only and sync_dist:
        raise MisconfigurationError(
            f"self.log({name!r}, rank_zero_only=True, sync_dist=True): a value logged from rank 0 only cannot be "
            "reduced across ranks; drop one of them."
        )
    if add_dataloader_idx and "/dataloader_idx_" in name:
        raise MisconfigurationError(
            f"self.log({name!r}): the name already holds '/dataloader_idx_', which add_dataloader_idx=True appends "
            "itself; rename it, or pass add_dataloader_idx=False."
        )
