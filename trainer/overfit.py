"""`Trainer(overfit_batches=N)`: during fit, the train and val loaders go through their data in order, so that every
epoch trains (and validates) on the same first N batches. The limits themselves are set in trainer/flags.py; here a
shuffled loader is rebuilt around a `SequentialSampler`, with Lightning's warning (Lightning does the same by
re-instantiating the loader; we rebuild plain DataLoaders only, and name the flag for anything else)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, IterableDataset, SequentialSampler

from strategies.distributed import rank_zero_warn
from strategies.exceptions import ConfigError

# the DataLoader arguments a rebuilt loader keeps (the sampler is replaced; shuffle is what it replaces)
_KEPT = ("batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn",
         "multiprocessing_context", "generator", "prefetch_factor", "persistent_workers", "pin_memory_device",
         "in_order")


def in_order(loaders: list[Any], stage: str) -> list[Any]:
    """The loaders of `stage` ("train" or "val") with shuffling off; a warning when one was shuffled."""
    if all(_is_sequential(dl) for dl in loaders):
        return loaders
    rank_zero_warn(f"You requested to overfit but enabled {stage} dataloader shuffling. We are turning off the "
                   f"{stage} dataloader shuffling for you (overfit_batches trains on the same batches every epoch).")
    return [dl if _is_sequential(dl) else _rebuilt(dl, stage) for dl in loaders]


def _is_sequential(loader: Any) -> bool:
    """Loaders without a map-style sampler (iterables, IterableDatasets) have an order of their own: kept."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return True
    return isinstance(loader.sampler, SequentialSampler)


def _rebuilt(loader: DataLoader, stage: str) -> DataLoader:
    if type(loader) is not DataLoader or loader.batch_size is None:
        raise ConfigError(
            f"overfit_batches needs the {stage} data in order, but the {type(loader).__name__} uses "
            f"{type(loader.batch_sampler or loader.sampler).__name__}, which cannot be rebuilt around a "
            "SequentialSampler; pass a loader with shuffle=False (or a sequential sampler), or drop overfit_batches."
        )
    kwargs = {name: getattr(loader, name) for name in _KEPT if hasattr(loader, name)}
    if kwargs.get("num_workers", 0) == 0:  # DataLoader refuses these without workers
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
    return DataLoader(loader.dataset, sampler=SequentialSampler(loader.dataset), **kwargs)  # type: ignore[arg-type]
