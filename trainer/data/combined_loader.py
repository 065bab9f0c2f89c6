"""`CombinedLoader`: several iterables read together (Lightning's class and modes), so a training step can take a
batch from each loader (`{"a": batch_a, "b": batch_b}`), and evaluation can run loaders one after another.

Modes, as in Lightning: "min_size" stops with the shortest iterable; "max_size_cycle" restarts the shorter ones
until the longest is done (what the Trainer uses for a list or dict of training loaders); "max_size" gives None
for iterables that are done; "sequential" reads one iterable after the other, yielding its own batch index and the
iterable's index. Iterating yields `(batch, batch_idx, dataloader_idx)`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils._pytree import tree_flatten, tree_unflatten

from trainer.data.lengths import loader_length

MODES = ("min_size", "max_size_cycle", "max_size", "sequential")


def _is_leaf(value: Any) -> bool:
    """An iterable of the collection: anything but a list, tuple or dict, and one of those that holds only numbers
    and strings (a list of samples is one iterable, as in Lightning)."""
    if not isinstance(value, (list, tuple, dict)):
        return True
    children = value.values() if isinstance(value, dict) else value
    return all(isinstance(child, (int, float, str)) for child in children)


class CombinedLoader(Iterable):
    """Combines the iterables of a list, tuple or dict (nested too) under one of `MODES`."""

    def __init__(self, iterables: Any, mode: str = "min_size") -> None:
        if mode not in MODES:
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: {list(MODES)}.")
        self._iterables = iterables
        self._flattened, self._spec = tree_flatten(iterables, is_leaf=_is_leaf)
        self._mode = mode
        self._limits: list[int | float] | None = None
        self._iterator: Iterator[tuple[Any, int, int]] | None = None

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def iterables(self) -> Any:
        """The collection of iterables as given."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables as a flat list, in the collection's order."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened: list[Any]) -> None:
        if len(flattened) != len(self._flattened):
            raise ValueError(f"Mismatch in flattened length ({len(flattened)}) and existing length "
                             f"({len(self._flattened)})")
        self._iterables = tree_unflatten(flattened, self._spec)
        self._flattened = flattened

    @property
    def limits(self) -> list[int | float] | None:
        """Optional number of batches per iterable (the Trainer sets them from `limit_*_batches`)."""
        return self._limits

    @limits.setter
    def limits(self, limits: int | float | list[int | float] | None) -> None:
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif isinstance(limits, list) and len(limits) != len(self._flattened):
            raise ValueError(f"Mismatch in number of limits ({len(limits)}) and number of iterables "
                             f"({len(self._flattened)})")
        self._limits = limits

    @property
    def sampler(self) -> Any:
        return tree_unflatten([getattr(x, "sampler", None) for x in self._flattened], self._spec)

    @property
    def batch_sampler(self) -> Any:
        return tree_unflatten([getattr(x, "batch_sampler", None) for x in self._flattened], self._spec)

    def _lengths(self) -> list[int | float]:
        lengths = [loader_length(x) for x in self._flattened]
        if self._limits is None:
            return lengths
        return [min(length, limit) for length, limit in zip(lengths, self._limits, strict=True)]

    def __len__(self) -> int:
        lengths = self._lengths()
        if not lengths:
            return 0
        total = sum(lengths) if self._mode == "sequential" else min(lengths) if self._mode == "min_size" \
            else max(lengths)
        if total == math.inf:
            raise TypeError("CombinedLoader has no length: one of its iterables has none")
        return int(total)

    def __iter__(self) -> CombinedLoader:
        read = {"min_size": self._min_size, "max_size_cycle": self._max_size_cycle, "max_size": self._max_size,
                "sequential": self._sequential}[self._mode]
        self._iterator = read()
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self._iterator is None:
            raise RuntimeError("call iter(combined_loader) first")
        return next(self._iterator)

    def reset(self) -> None:
        """Forget the current pass (its iterators, and with them any worker processes)."""
        self._iterator = None

    # --- the modes ----------------------------------------------------------------------------------------
    def _combined(self, batches: list[Any]) -> Any:
        return tree_unflatten(batches, self._spec)

    def _min_size(self) -> Iterator[tuple[Any, int, int]]:
        iterators = [iter(x) for x in self._flattened]
        index = 0
        while True:
            try:
                batches = [next(it) for it in iterators]
            except StopIteration:
                return
            yield self._combined(batches), index, 0
            index += 1

    def _max_size_cycle(self) -> Iterator[tuple[Any, int, int]]:
        iterators = [iter(x) for x in self._flattened]
        done = [False] * len(iterators)
        index = 0
        while iterators:
            batches = []
            for i, it in enumerate(iterators):
                try:
                    batches.append(next(it))
                except StopIteration:
                    done[i] = True
                    if all(done):
                        return
                    iterators[i] = iter(self._flattened[i])  # start the shorter one again
                    batches.append(next(iterators[i]))
            yield self._combined(batches), index, 0
            index += 1

    def _max_size(self) -> Iterator[tuple[Any, int, int]]:
        iterators: list[Iterator[Any] | None] = [iter(x) for x in self._flattened]
        index = 0
        while True:
            batches = []
            for i, it in enumerate(iterators):
                batch = next(it, _DONE) if it is not None else _DONE
                if batch is _DONE:
                    iterators[i] = None
                batches.append(None if batch is _DONE else batch)
            if all(it is None for it in iterators):
                return
            yield self._combined(batches), index, 0
            index += 1

    def _sequential(self) -> Iterator[tuple[Any, int, int]]:
        for loader_idx, iterable in enumerate(self._flattened):
            limit = self._limits[loader_idx] if self._limits is not None else math.inf
            for batch_idx, batch in enumerate(iterable):
                if batch_idx >= limit:
                    break
                yield batch, batch_idx, loader_idx


_DONE = object()


class CombinedBatches(Iterable):
    """What a loop iterates for a CombinedLoader in a mode other than "sequential": the combined batches only
    (Lightning passes the step the combined batch and no dataloader_idx), with the length the limits allow and
    `set_epoch` for every iterable's sampler."""

    def __init__(self, combined: CombinedLoader) -> None:
        self.combined = combined

    def __iter__(self) -> Iterator[Any]:
        return (batch for batch, _, _ in iter(self.combined))

    def __len__(self) -> int:
        return len(self.combined)

    def inner_loaders(self) -> list[Any]:
        return list(self.combined.flattened)

    @property
    def sampler(self) -> Any:
        """The inner loaders' resumable samplers as one, for a bit-exact mid-epoch resume
        (trainer/checkpoint/resume.py)."""
        from trainer.data.sampling import ResumableSampler, ResumableSamplers

        return ResumableSamplers([s if isinstance(s := getattr(x, "sampler", None), ResumableSampler) else None
                                  for x in self.combined.flattened])
