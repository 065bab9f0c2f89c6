"""Dataloaders: resolve them (arguments > datamodule > module hooks), call
set_epoch, and iterate telling the loop which batch is the last (samplers: trainer/data/sampling.py)."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from strategies.exceptions import MisconfigurationError
from trainer.data.combined_loader import CombinedLoader
from trainer.data.lengths import loader_length
from trainer.hooks import DATAMODULE, MODULE, timed

T = TypeVar("T")
_HOOKS = {"train": "train_dataloader", "val": "val_dataloader", "test": "test_dataloader",
          "predict": "predict_dataloader"}


def suggested_max_num_workers(local_world_size: int) -> int:
    """An upper bound for a DataLoader's `num_workers`: the CPUs this process may use, shared by the
    `local_world_size` processes of this machine, less one each for the process itself (at least 1)."""
    if local_world_size < 1:
        raise ValueError(f"suggested_max_num_workers(local_world_size={local_world_size}): use 1 or more.")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // local_world_size - 1)


def requested(stage: str, given: Any, datamodule: Any, module: Any, profiler: Any = None) -> Any:
    """What the user gives for `stage`: the argument, else the datamodule's hook, else the module's hook (timed as
    Lightning names it when `profiler` is on)."""
    if given is not None:
        return given
    hook = _HOOKS[stage]
    for owner, tag in ((datamodule, DATAMODULE), (module, MODULE)):
        fn = getattr(owner, hook, None) if owner is not None else None
        if fn is not None and not getattr(fn, "_is_default_hook", False):
            return fn() if profiler is None else timed(profiler, f"{tag}{type(owner).__name__}.{hook}", fn)()
    return None


def resolve_loaders(stage: str, given: Any, datamodule: Any, module: Any, profiler: Any = None,
                    ) -> CombinedLoader | None:
    """The evaluation or prediction loaders for `stage` as one CombinedLoader: the user's own, or the loaders
    (one, a list or tuple, or a dict) read one after another ("sequential", in `dataloader_idx` order). None when
    the stage has no source."""
    source = requested(stage, given, datamodule, module, profiler)
    if source is None:
        return None
    combined = source if isinstance(source, CombinedLoader) else CombinedLoader(source, "sequential")
    for loader in combined.flattened:
        if not isinstance(loader, Iterable):
            raise MisconfigurationError(
                f"{_HOOKS[stage]}() returned {type(loader).__name__}; return a DataLoader or an iterable."
            )
    return combined


def set_epoch(loader: Iterable, epoch: int) -> None:
    """Tell samplers (DistributedSampler and friends) which epoch starts, so shuffling changes per epoch."""
    inner = getattr(loader, "inner_loaders", None)
    if callable(inner):  # several training loaders read together
        for each in inner():
            set_epoch(each, epoch)
        return
    samplers = {id(obj): obj for obj in (getattr(loader, "sampler", None),
                                         getattr(getattr(loader, "batch_sampler", None), "sampler", None))}
    for obj in samplers.values():  # each once: a loader's sampler is usually its batch sampler's too (Lightning's rule)
        fn = getattr(obj, "set_epoch", None)
        if callable(fn):
            fn(epoch)


def runs_out(loader: Iterable, batches: int | float) -> bool:
    """Whether reading `batches` batches reads all of `loader`, so that a `for` loop over it would go on to its end.
    Never for several loaders read together: Lightning reads no batch past the combined length there (a shorter
    loader asked for one more would start its next pass, drawing from the RNG)."""
    if callable(getattr(loader, "inner_loaders", None)):
        return False
    return batches != math.inf and loader_length(loader) == batches


def run_out(iterator: Iterator[Any]) -> None:
    """Ask an epoch's iterator for the batch after its last, as the `for` loop of a plain script does.

    Samplers finish their epoch there: RandomSampler with a generator draws one more permutation
    from it before stopping, so the next epoch starts from the generator state a plain loop has.
    """
    next(iterator, None)


def iterate(loader: Iterable, max_batches: int | float, start: int = 0) -> Iterator[tuple[int, Any, bool]]:
    """Yield (batch_idx, batch, is_last) for batches `start` .. `max_batches - 1` of `loader`.

    `loader` may be an iterator already positioned at batch `start` (a resumed epoch). When the
    count is known the batches are fetched exactly as a plain `for` loop would (so data-side
    randomness interleaves with the step as in a raw loop); only length-less loaders are read one
    batch ahead to find the last one.
    """
    if max_batches - start <= 0:
        return
    if max_batches != math.inf:
        last = int(max_batches) - 1
        for idx, batch in enumerate(loader, start=start):
            yield idx, batch, idx == last
            if idx == last:
                return
        return
    it = iter(loader)
    try:
        current = next(it)
    except StopIteration:
        return
    idx = start
    for upcoming in it:
        yield idx, current, False
        current, idx = upcoming, idx + 1
    yield idx, current, True


def timed_fetches(iterable: Iterable[T], profiler: Any, action: str) -> Iterable[T]:
    """`iterable`, with the fetch of each batch timed as `action` when `profiler` is on (Lightning's
    `[_TrainingEpochLoop].train_dataloader_next` & co.); `iterable` itself when it is off."""
    if not profiler.enabled:
        return iterable
    return _TimedFetches(iter(iterable), profiler, action)


class _TimedFetches(Iterator[T]):
    def __init__(self, iterator: Iterator[T], profiler: Any, action: str) -> None:
        self._iterator, self._profiler, self._action = iterator, profiler, action

    def __next__(self) -> T:
        with self._profiler.profile(self._action):
            return next(self._iterator)
