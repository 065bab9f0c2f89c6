"""Rank-zero helpers and collectives that are identities when no process group is running.

These are the only process-global helpers in the project: `rank_zero_only.rank` mirrors the
current process's rank so that printing and file I/O can be gated without a Trainer in reach.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import socket
import warnings
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

import torch
import torch.distributed as dist

from strategies.exceptions import LightningDeprecationWarning, PossibleUserWarning

F = TypeVar("F", bound=Callable[..., Any])


def _rank_from_env() -> int:
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if key in os.environ:
            try:
                return int(os.environ[key])
            except ValueError:
                pass
    return 0


def rank_zero_only(fn: F) -> F:
    """Run `fn` only on global rank 0 and return None elsewhere (`rank_zero_only.rank` holds the rank)."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if rank_zero_only.rank == 0:  # type: ignore[attr-defined]  # a function attribute, as in Lightning
            return fn(*args, **kwargs)
        return None

    return cast(F, wrapped)


# mypy does not model attributes set on a function; Lightning's `rank_zero_only.rank` is one, and users set it.
rank_zero_only.rank = _rank_from_env()  # type: ignore[attr-defined]


@rank_zero_only
def rank_zero_info(message: str) -> None:
    """Log (and print) an informational message once, from rank 0."""
    print(message, flush=True)


@rank_zero_only
def rank_zero_warn(message: str, category: type[Warning] = UserWarning, stacklevel: int = 3) -> None:
    """Emit a warning once, from rank 0."""
    warnings.warn(message, category, stacklevel=stacklevel)


@rank_zero_only
def rank_zero_debug(message: str) -> None:
    """Log a debug message once, from rank 0, to the `trainer` logger (shown with logging at DEBUG level)."""
    logging.getLogger("trainer").debug(message)


def rank_zero_deprecation(message: str, stacklevel: int = 4) -> None:
    """Emit a `LightningDeprecationWarning` from rank 0 (Lightning's helper for a library's own deprecations)."""
    rank_zero_warn(message, category=LightningDeprecationWarning, stacklevel=stacklevel)


def rank_prefixed_message(message: str, rank: int | None) -> str:
    """`message` prefixed with `[rank: N]` when a rank is given, so that lines of several ranks can be told apart."""
    return message if rank is None else f"[rank: {rank}] {message}"


class WarningCache(set):
    """Messages already shown: `warn`, `deprecation` and `info` show each distinct message once, from rank 0."""

    def warn(self, message: str, category: type[Warning] = UserWarning, stacklevel: int = 4) -> None:
        if message not in self:
            self.add(message)
            rank_zero_warn(message, category=category, stacklevel=stacklevel)

    def deprecation(self, message: str, stacklevel: int = 5) -> None:
        if message not in self:
            self.add(message)
            rank_zero_deprecation(message, stacklevel=stacklevel)

    def info(self, message: str) -> None:
        if message not in self:
            self.add(message)
            rank_zero_info(message)


def disable_possible_user_warnings(module: str = "") -> None:
    """Silence the `PossibleUserWarning`s (those raised from modules whose name starts with `module`, if given)."""
    warnings.filterwarnings("ignore", category=PossibleUserWarning, module=module)


def is_distributed() -> bool:
    """True when a default process group is running with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


_REDUCE_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN", "mean": "SUM"}


def all_reduce(tensor: torch.Tensor, op: str = "mean", group: Any = None) -> torch.Tensor:
    """Reduce `tensor` over all ranks, or over the ranks of `group` (a copy; the input is untouched). Identity
    without a process group."""
    if op not in _REDUCE_OPS:
        raise ValueError(f"all_reduce op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
    if not is_distributed():
        return tensor
    out = tensor.detach().clone()
    dist.all_reduce(out, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]), group=group)
    if op == "mean":
        out = out / dist.get_world_size(group)
    return out


def all_reduce_max_ints(values: list[int], group: Any = None) -> list[int]:
    """Element-wise MAX of small integers over all ranks, on CPU (the control plane). Identity alone."""
    if not is_distributed():
        return values
    tensor = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return tensor.tolist()


class Pending(Protocol):
    """A round of the step agreement in flight, whatever carries it (a gloo all-reduce here, or this machine's
    shared-memory board, strategies/comm/agreement_board.py)."""

    def done(self) -> bool: ...

    def wait(self) -> list[int]: ...


class PendingMax:
    """An element-wise MAX of small integers in flight (`start_all_reduce_max_ints`); `wait()` gives the result."""

    __slots__ = ("_tensor", "_work")

    def __init__(self, tensor: torch.Tensor, work: Any) -> None:
        self._tensor, self._work = tensor, work

    def done(self) -> bool:
        """Whether the round completed (without waiting); a round whose peer left never does."""
        return self._work is None or bool(self._work.is_completed())

    def wait(self) -> list[int]:
        if self._work is not None:
            self._work.wait()
            self._work = None
        return self._tensor.tolist()


def start_all_reduce_max_ints(values: list[int], group: Any = None) -> PendingMax:
    """Start `all_reduce_max_ints` without waiting for it, so that its latency hides behind other work. Every rank
    must start the same rounds in the same order, as with any collective."""
    tensor = torch.tensor(values, dtype=torch.int64)
    if not is_distributed():
        return PendingMax(tensor, None)
    return PendingMax(tensor, dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group, async_op=True))


def all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Stack `tensor` from every rank along a new dim 0. Without a process group: `tensor[None]`."""
    if not is_distributed():
        return tensor.unsqueeze(0)
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.stack(parts)


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's `obj`, indexed by rank. Without a process group: `[obj]`."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Send a picklable object from `src` to every rank. Identity without a process group."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    """Wait for every rank. No-op without a process group."""
    if is_distributed():
        dist.barrier()


def _ephemeral_ports() -> range:
    """The ports the kernel hands to outgoing connections (Linux's default where the setting cannot be read)."""
    try:
        low, high = (int(v) for v in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))  # every address, as the rendezvous store binds it
        except OSError:
            return False
    return True


def find_free_port() -> int:
    """A TCP port that is free right now (never a fixed 29500: parallel jobs collide), for a rank to bind later.

    Chosen at random below the kernel's ephemeral range: a port from that range (what binding port 0 returns) can be
    handed to any outgoing connection between this check and the bind, which failed a ddp_spawn launch with
    EADDRINUSE on a busy machine; ports outside it are taken only by explicit binds."""
    ephemeral = _ephemeral_ports()
    candidates = range(max(1024, ephemeral.start - 12000), ephemeral.start)
    for _ in range(64):
        port = random.SystemRandom().choice(candidates)
        if port not in ephemeral and _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a crowded machine: any free port
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
