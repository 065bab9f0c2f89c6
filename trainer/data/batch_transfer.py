"""The batch-transfer hooks: `on_before_batch_transfer`, `transfer_batch_to_device`, `on_after_batch_transfer`,
called in that order on every train, validation, test and predict batch, as in Lightning.

Each hook is taken from the DataModule when it defines it (with a warning when the module defines it as well), else
from the module: Lightning's rule. The owners are picked once per run, so a run that overrides none of the three pays
one attribute read per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strategies.comm.distributed import rank_zero_warn

TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def _defines(obj: Any, name: str, base: type, *, called_always: bool = False) -> bool:
    """The DataModule's hook counts when it is overridden (Lightning's rule); the module's whenever calling it may do
    something (`called_always`: Lightning calls the module's hook in any case, a wrapper of the default included)."""
    from trainer.hooks import is_overridden, runs_hook

    if obj is None:
        return False
    return runs_hook(obj, name, base) if called_always else is_overridden(obj, name, base)


class BatchTransfer:
    """Moves a batch to the run's device through the user's transfer hooks, when there are any."""

    def __init__(self) -> None:
        self._before: Callable[[Any, int], Any] | None = None
        self._move: Callable[[Any, Any, int], Any] | None = None
        self._after: Callable[[Any, int], Any] | None = None
        self.active = False  # any of the three hooks is user-defined
        self._profiler: Any = None  # on: the strategy's batch_to_device is timed too

    def __getstate__(self) -> dict[str, Any]:
        return {"_before": None, "_move": None, "_after": None, "active": False,  # picked again by the next run
                "_profiler": None}

    def resolve(self, module: Any, datamodule: Any, profiler: Any = None) -> None:
        """Pick, per hook, the object whose definition runs (the datamodule's first). With a profiler on, the
        module's defaults run too, timed as Lightning names them (Lightning calls all three at every batch)."""
        from trainer.core.datamodule import DataModule
        from trainer.core.module import TrainModule
        from trainer.hooks import DATAMODULE, MODULE, module_hook, timed

        profiling = profiler is not None and profiler.enabled
        picked: list[Any] = []
        for name in TRANSFER_HOOKS:
            in_data = _defines(datamodule, name, DataModule)
            if in_data and _defines(module, name, TrainModule):
                rank_zero_warn(f"`{name}` is defined on both the TrainModule and the DataModule; the DataModule's "
                               "runs (as in Lightning).")
            in_module = _defines(module, name, TrainModule, called_always=True) or \
                profiling and module_hook(module, name) is not None
            owner, tag = (datamodule, DATAMODULE) if in_data else (module, MODULE) if in_module else (None, "")
            fn = getattr(owner, name) if owner is not None else None
            picked.append(timed(profiler, f"{tag}{type(owner).__name__}.{name}", fn) if profiling and fn else fn)
        self._before, self._move, self._after = picked
        self.active = any(fn is not None for fn in picked)
        self._profiler = profiler if profiling else None

    def __call__(self, strategy: Any, batch: Any, dataloader_idx: int) -> Any:
        """The batch on the device: before-hook, the move (the user's or the strategy's), after-hook."""
        if not self.active:
            return strategy.batch_to_device(batch)
        if self._before is not None:
            batch = self._before(batch, dataloader_idx)
        move, to_device = self._move, strategy.batch_to_device
        if self._profiler is not None:
            from trainer.hooks import STRATEGY, timed

            to_device = timed(self._profiler, f"{STRATEGY}{type(strategy).__name__}.batch_to_device", to_device)
        if move is None:
            batch = to_device(batch)
        else:
            batch = to_device(batch, lambda b, device: move(b, device, dataloader_idx))
        if self._after is not None:
            batch = self._after(batch, dataloader_idx)
        return batch
