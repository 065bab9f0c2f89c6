"""Training samplers whose order can be replayed, and distributed sharding for every stage.

Data order is a pure function of (seed, epoch, rank, position): the training loader's sampler is
wrapped in a ResumableSampler, which records the seed of each epoch's permutation so a mid-epoch
resume replays it and skips the consumed indices, without loading (and discarding) any batch.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler, Sampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import PossibleUserWarning
from trainer.data.loader_rebuild import LOADER_ARGS, ShardedSampler, index_sampler, rebuild_loader
from trainer.seed import SEED_ENV


class UnpaddedDistributedSampler(Sampler[int]):
    """Evaluation sharding that counts every sample exactly once: rank r takes indices r, r+N, ...

    DistributedSampler pads by repeating samples so all ranks get equal counts, which is right for
    training (collectives every step) but biases evaluation metrics; evaluation has no per-batch
    collectives, so uneven shards are safe.
    """

    def __init__(self, dataset: Any, num_replicas: int, rank: int) -> None:
        self.length, self.num_replicas, self.rank = len(dataset), num_replicas, rank

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.num_replicas))


class IndexRecorder(Sampler[int]):
    """Wraps a predict loader's sampler and keeps the dataset indices it gave out in this pass.

    The loader's BatchSampler takes them in order, `batch_size` at a time, so batch k holds positions
    k*batch_size .. (k+1)*batch_size - 1 of what was given out, however far ahead the workers prefetch. This is
    what `BasePredictionWriter` receives as `batch_indices`, and how predictions from several ranks are put back
    into the dataset's order.
    """

    def __init__(self, inner: Sampler[int], batch_size: int) -> None:
        self.inner, self.batch_size = inner, batch_size
        self.seen: list[int] = []

    def __iter__(self) -> Iterator[int]:
        self.seen = []
        return self._record(iter(self.inner))

    def _record(self, indices: Iterator[int]) -> Iterator[int]:
        for index in indices:
            self.seen.append(int(index))
            yield index

    def __len__(self) -> int:
        if not isinstance(self.inner, Sized):
            raise TypeError(f"{type(self.inner).__name__} has no length")
        return len(self.inner)

    def batch_indices(self, batch_idx: int) -> list[int]:
        """The dataset indices of batch `batch_idx` of this pass."""
        return self.seen[batch_idx * self.batch_size:(batch_idx + 1) * self.batch_size]


def record_indices(loader: Iterable) -> Iterable:
    """A predict loader: a plain DataLoader over a map-style dataset is re-built so its sampler records the indices
    of every batch, with `drop_last=False` (Lightning's rule: every sample gets a prediction); any other loader
    (DataLoader subclass, custom batch sampler, iterable dataset, no batching) is kept as it is."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    batches = loader.batch_sampler
    if type(loader) is not DataLoader or type(batches) is not BatchSampler or batches.sampler is not loader.sampler \
            or isinstance(loader.sampler, IndexRecorder) or not isinstance(loader.batch_size, int):
        if loader.drop_last:
            rank_zero_warn(f"the predict loader ({type(loader).__name__}) drops its last incomplete batch and cannot "
                           "be re-built with drop_last=False: some samples get no prediction.",
                           category=PossibleUserWarning)
        return loader
    sampler = loader.sampler
    assert isinstance(sampler, Sampler)  # a plain DataLoader with a BatchSampler over it: a Sampler of its own
    return _rebuild(loader, IndexRecorder(sampler, loader.batch_size), drop_last=False)


class ResumableSampler(Sampler[int]):
    """Wraps a training sampler; records what fixes each epoch's order and can replay it from a position.

    Iterating the loader draws exactly what a plain `for batch in loader` draws, epoch after epoch:
    a RandomSampler without a generator takes its permutation seed from the global torch RNG (we
    draw it the way RandomSampler does, and remember it); one with a generator draws from that
    generator. What an epoch needs to be replayed is recorded by `begin_epoch`, right before the
    loader's iterator is created: the states of the torch.Generators the loader uses (its own
    `generator`, which seeds workers, and the sampler's), the seed drawn for the permutation, or a
    DistributedSampler's seed (its order is a pure function of seed and epoch).
    """

    def __init__(self, inner: Sampler[int], generators: Iterable[Any] = ()) -> None:
        self.inner = inner
        self.generators: list[torch.Generator] = []
        for gen in (*generators, getattr(inner, "generator", None)):
            if isinstance(gen, torch.Generator) and all(gen is not known for known in self.generators):
                self.generators.append(gen)
        self.epoch_state: dict[str, Any] = {}
        self._seed: int | None = None
        self._later_seeds: list[int] = []  # seeds of the epoch's later passes, replayed (several loaders, cycling)
        self._skip = 0

    def generator_states(self) -> list[Tensor]:
        return [gen.get_state() for gen in self.generators]

    def set_generator_states(self, states: list[Tensor]) -> None:
        for gen, state in zip(self.generators, states, strict=False):
            gen.set_state(state)

    def begin_epoch(self, replay: dict[str, Any] | None = None, skip: int = 0) -> None:
        """Call right before the epoch's iterator is created. With `replay` (an earlier `epoch_state`),
        the epoch repeats that epoch's order from its start, leaving out the first `skip` indices."""
        replay = replay or {}
        if "generators" in replay:
            self.set_generator_states(replay["generators"])
        self.keep_run_seed(replay)
        self._seed, self._skip = replay.get("seed"), skip
        self._later_seeds = list(replay.get("seeds", []))[1:]
        self.epoch_state = {"generators": self.generator_states()}
        if isinstance(self.inner, DistributedSampler):
            self.epoch_state["distributed_seed"] = self.inner.seed

    def keep_run_seed(self, epoch_state: dict[str, Any]) -> None:
        """A resumed run keeps the distributed shuffling seed of the run it continues, whatever it was seeded with."""
        if isinstance(self.inner, DistributedSampler) and "distributed_seed" in epoch_state:
            self.inner.seed = epoch_state["distributed_seed"]

    def __iter__(self) -> Iterator[int]:
        seed, skip = self._seed, self._skip
        self._seed, self._skip = None, 0
        inner = self.inner
        indices: Iterable[int] = inner
        if type(inner) is RandomSampler and inner.generator is None:
            if seed is None and self._later_seeds:
                seed = self._later_seeds.pop(0)
            if seed is None:
                seed = int(torch.empty((), dtype=torch.int64).random_().item())  # RandomSampler's own draw
            generator = torch.Generator()
            generator.manual_seed(seed)
            indices = RandomSampler(inner.data_source, replacement=inner.replacement,
                                    num_samples=inner.num_samples, generator=generator)
            self.epoch_state["seed"] = self.epoch_state.get("seed", seed)
            self.epoch_state["seeds"] = [*self.epoch_state.get("seeds", []), seed]  # a new list: copies stay
        return itertools.islice(iter(indices), skip, None)

    def __len__(self) -> int:
        if not isinstance(self.inner, Sized):  # torch's Sampler declares no length; the samplers we wrap have one
            raise TypeError(f"{type(self.inner).__name__} has no length")
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        """Called at every epoch start, before any replay is armed: a replay never leaks into the next epoch."""
        self._seed, self._skip, self._later_seeds = None, 0, []
        fn = getattr(self.inner, "set_epoch", None)
        if callable(fn):
            fn(epoch)


_DEFAULT_SAMPLERS = (RandomSampler, SequentialSampler, DistributedSampler)


def _plain(loader: DataLoader) -> bool:
    """A DataLoader with a default sampler and batching, that a single-process run re-builds for resume."""
    # A batch sampler the user built (even a plain BatchSampler) is theirs: re-building would drop it.
    sampler, batches = loader.sampler, loader.batch_sampler
    return type(loader) is DataLoader and type(sampler) in _DEFAULT_SAMPLERS and (
        batches is None or (type(batches) is BatchSampler and batches.sampler is sampler)
    )


def _sharded(loader: DataLoader, sampler: Any, kwargs: dict[str, Any], training: bool, even: bool) -> Sampler[int]:
    """This rank's sampler, as Lightning picks it: for the default samplers a DistributedSampler over the dataset
    (shuffled when the loader shuffled), for any other sampler a shard of its own order. Evaluation is unpadded
    (every sample counts once) unless `even`: then every rank gets as many samples, a few counted twice, because
    the strategy's forward is a collective that every rank must join as often (ZeRO-3)."""
    if isinstance(sampler, (RandomSampler, SequentialSampler)):
        if not training and not even:
            return UnpaddedDistributedSampler(loader.dataset, **kwargs)
        seed = int(os.environ.get(SEED_ENV, 0))
        shuffle = training and isinstance(sampler, RandomSampler)
        return DistributedSampler(loader.dataset, shuffle=shuffle, seed=seed, **kwargs)
    return ShardedSampler(sampler, pad=training or even, **kwargs)


def _rebuild(loader: DataLoader, sampler: Sampler[int], **overrides: Any) -> DataLoader:
    kwargs = {name: getattr(loader, name) for name in LOADER_ARGS if hasattr(loader, name)}
    kwargs.update(overrides)
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
    return DataLoader(loader.dataset, sampler=sampler, **kwargs)


def prepare_loader(loader: Iterable, sampler_kwargs: dict[str, Any] | None, training: bool,
                   even: bool = False) -> Iterable:
    """Re-build a DataLoader around the sampler this run needs.

    When the strategy shards data, every DataLoader gets this rank's sampler (trainer/data/loader_rebuild.py re-creates
    subclasses and custom batch samplers with their own arguments); one with a DistributedSampler already is left
    as it is. Training wraps the sampler in a ResumableSampler (bit-exact mid-epoch resume). A single-process run
    re-builds only plain DataLoaders, for training; everything else is left untouched.
    """
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset):
        return loader
    inner = index_sampler(loader)
    if sampler_kwargs is not None and not isinstance(inner, DistributedSampler):
        sampler = _sharded(loader, inner, sampler_kwargs, training, even)
    elif training and _plain(loader):
        sampler = inner
    else:
        return loader
    if training and not is_stateful(loader):  # a stateful loader resumes through its own state
        sampler = ResumableSampler(sampler, [loader.generator])
    return rebuild_loader(loader, sampler)


class ResumableSamplers:
    """The ResumableSamplers of several training loaders read together, with one sampler's interface for resume.

    Such an epoch is replayed by reading its consumed batches again (`replays_by_reading`), from the epoch-start
    RNG and generator states, with each pass's recorded permutation seed: a shorter loader that started a new
    pass mid-epoch drew that seed from the global RNG between steps, which the replay cannot redo."""

    replays_by_reading = True

    def __init__(self, samplers: list[ResumableSampler | None]) -> None:
        self.samplers = samplers

    @property
    def epoch_state(self) -> dict[str, Any]:
        return {"inner": [dict(s.epoch_state) if s is not None else {} for s in self.samplers]}

    def _paired(self, states: Any) -> list[tuple[ResumableSampler, Any]]:
        return [(s, state) for s, state in zip(self.samplers, states or [], strict=False) if s is not None]

    def generator_states(self) -> list[Any]:
        return [s.generator_states() if s is not None else [] for s in self.samplers]

    def set_generator_states(self, states: list[Any]) -> None:
        for sampler, state in self._paired(states):
            sampler.set_generator_states(state)

    def keep_run_seed(self, epoch_state: dict[str, Any]) -> None:
        for sampler, state in self._paired(epoch_state.get("inner")):
            sampler.keep_run_seed(state)

    def begin_epoch(self, replay: dict[str, Any] | None = None, skip: int = 0) -> None:
        states = (replay or {}).get("inner") or [{}] * len(self.samplers)
        for sampler, state in zip(self.samplers, states, strict=False):
            if sampler is not None:
                sampler.begin_epoch(state)


def is_stateful(loader: Any) -> bool:
    """A loader that saves and restores its own position (torchdata's StatefulDataLoader, or any with both)."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


class LoaderState:
    """A stateful training loader seen through the sampler interface resume uses: its state is its own
    `state_dict()` (taken before every fetch, so a checkpoint inside a step can roll back to it), and a
    mid-epoch resume loads it and goes on iterating (`replays_by_state`), skipping and re-reading nothing."""

    replays_by_state = True

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    @property
    def epoch_state(self) -> dict[str, Any]:
        return {"loader": self.loader.state_dict()}

    def generator_states(self) -> list[Any]:
        return []

    def set_generator_states(self, states: list[Any]) -> None:
        """Nothing: the loader's state holds its generators."""

    def keep_run_seed(self, epoch_state: dict[str, Any]) -> None:
        """Nothing: the loader's state holds its seeds."""

    def begin_epoch(self, replay: dict[str, Any] | None = None, skip: int = 0) -> None:
        if replay and "loader" in replay:
            self.loader.load_state_dict(replay["loader"])


def resumable_sampler(loader: Any) -> ResumableSampler | ResumableSamplers | LoaderState | None:
    if is_stateful(loader):
        return LoaderState(loader)
    sampler = getattr(loader, "sampler", None)
    return sampler if isinstance(sampler, (ResumableSampler, ResumableSamplers)) else None
