"""`Trainer(overfit_batches=N)`: during fit, the train and val loaders go through their data in order, so that every
epoch trains (and validates) on the same first N batches. The limits themselves are set in trainer/setup/flags.py; here
a shuffled loader is rebuilt around a `SequentialSampler` (trainer/data/loader_rebuild.py: DataLoader subclasses and
custom batch samplers too), with Lightning's warning."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DataLoader, IterableDataset, SequentialSampler

from strategies.comm.distributed import rank_zero_warn
from trainer.data.loader_rebuild import index_sampler, rebuild_loader


def in_order(loaders: list[Any], stage: str) -> list[Any]:
    """The loaders of `stage` ("train" or "val") with shuffling off; a warning when one was shuffled."""
    if all(_is_sequential(dl) for dl in loaders):
        return loaders
    rank_zero_warn(f"You requested to overfit but enabled {stage} dataloader shuffling. We are turning off the "
                   f"{stage} dataloader shuffling for you (overfit_batches trains on the same batches every epoch).")
    return [dl if _is_sequential(dl) else _rebuilt(dl) for dl in loaders]


def _is_sequential(loader: Any) -> bool:
    """Loaders without a map-style sampler (iterables, IterableDatasets) have an order of their own: kept."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return True
    return isinstance(index_sampler(loader), SequentialSampler)


def _rebuilt(loader: DataLoader) -> DataLoader:
    return rebuild_loader(loader, SequentialSampler(loader.dataset))  # type: ignore[arg-type]
