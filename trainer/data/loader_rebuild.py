"""Re-creating a user's DataLoader around the sampler a run needs, as Lightning does: any sampler sharded across
ranks in its own order (`ShardedSampler`), and DataLoader subclasses and custom batch samplers re-instantiated with
their own constructor arguments, read back from the object's attributes."""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator, Sized
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, Sampler

from strategies.exceptions import MisconfigurationError

# The plain DataLoader arguments carried over when a loader is re-built around a new sampler.
LOADER_ARGS = ("batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last", "timeout",
               "worker_init_fn", "multiprocessing_context", "generator", "prefetch_factor",
               "persistent_workers", "pin_memory_device", "in_order")


class ShardedSampler(Sampler[int]):
    """This rank's share of any sampler's order: the sampler is read anew each epoch and rank r takes positions
    r, r+N, ... of it. Training pads the order by repeating its start (every rank gets as many samples, as
    DistributedSampler does, and as Lightning's DistributedSamplerWrapper gives); evaluation does not pad, so every
    sample counts once. The sampler keeps its own randomness; `set_epoch` reaches it."""

    def __init__(self, sampler: Any, num_replicas: int, rank: int, pad: bool) -> None:
        if not isinstance(sampler, Sized) or len(sampler) == math.inf:
            raise MisconfigurationError(
                f"{type(sampler).__name__} has no finite length, so it cannot be sharded across ranks: give it a "
                "__len__, or shard the data yourself and pass Trainer(use_distributed_sampler=False)."
            )
        self.sampler: Any = sampler
        self.num_replicas, self.rank, self.pad = num_replicas, rank, pad

    def __iter__(self) -> Iterator[Any]:
        order = list(self.sampler)
        if self.pad and order:
            total = math.ceil(len(order) / self.num_replicas) * self.num_replicas
            order = (order * math.ceil(total / len(order)))[:total]
        return iter(order[self.rank::self.num_replicas])

    def __len__(self) -> int:
        length = len(self.sampler)
        if self.pad:
            return math.ceil(length / self.num_replicas)
        return len(range(self.rank, length, self.num_replicas))

    def set_epoch(self, epoch: int) -> None:
        fn = getattr(self.sampler, "set_epoch", None)
        if callable(fn):
            fn(epoch)


def index_sampler(loader: DataLoader) -> Any:
    """The sampler that orders the dataset's indices: the loader's, or its custom batch sampler's `sampler`."""
    batches = loader.batch_sampler
    if batches is not None and type(batches) is not BatchSampler and hasattr(batches, "sampler"):
        return batches.sampler
    return loader.sampler


def rebuild_loader(loader: DataLoader, sampler: Sampler[int]) -> DataLoader:
    """A loader like `loader` (same class, arguments and batch sampler class) that draws its indices from
    `sampler`."""
    kwargs: dict[str, Any] = {name: getattr(loader, name) for name in LOADER_ARGS if hasattr(loader, name)}
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
    batches = loader.batch_sampler
    if batches is not None and type(batches) is not BatchSampler:
        for name in ("batch_size", "drop_last"):
            kwargs.pop(name, None)
        kwargs["batch_sampler"] = reinstantiate(batches, {"sampler": sampler}, "batch sampler")
    else:
        kwargs["sampler"] = sampler
    if type(loader) is DataLoader:
        return DataLoader(loader.dataset, **kwargs)
    return reinstantiate(loader, {"dataset": loader.dataset, **kwargs}, "DataLoader subclass")


def reinstantiate(obj: Any, given: dict[str, Any], what: str) -> Any:
    """`type(obj)(...)` with `given`, and the other constructor arguments read from `obj`'s attributes of the same
    name (Lightning's rule for loaders it must re-create); a required argument with no such attribute is an error
    that says how to fix it."""
    cls = type(obj)
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = {p.name: p for p in params if p.kind in kinds}
    call: dict[str, Any] = {}
    batching = ("batch_size", "shuffle", "sampler", "drop_last") if "batch_sampler" in given else ()
    for name, param in named.items():
        if name in given:
            call[name] = given[name]
        elif name in batching:
            continue  # the batch sampler does the batching; DataLoader refuses these beside it
        elif name == "shuffle" and ("sampler" in given or "batch_sampler" in given):
            call[name] = False  # the new sampler decides the order (and DataLoader refuses both)
        elif hasattr(obj, name):
            call[name] = getattr(obj, name)
        elif param.default is inspect.Parameter.empty:
            raise MisconfigurationError(
                f"cannot re-create the {what} {cls.__name__} around a distributed sampler: its __init__ takes "
                f"'{name}', which is neither a DataLoader argument nor an attribute of the object. Store it in "
                f"__init__ (self.{name} = {name}), or shard the data yourself and pass "
                "Trainer(use_distributed_sampler=False)."
            )
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
        call.update({k: v for k, v in given.items() if k not in named})
    for key in ("sampler", "batch_sampler"):
        if key in given and key not in call:
            raise MisconfigurationError(
                f"cannot re-create the {what} {cls.__name__} around a distributed sampler: its __init__ takes no "
                f"'{key}' (nor **kwargs). Accept and pass on {key}, or shard the data yourself and pass "
                "Trainer(use_distributed_sampler=False)."
            )
    return cls(**call)

