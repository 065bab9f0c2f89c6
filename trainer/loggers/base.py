"""Logger base class. Rank-zero gating happens here once: subclasses write without checking ranks."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from strategies.distributed import rank_zero_only

F = TypeVar("F", bound=Callable[..., Any])


def _rank_zero_method(fn: F) -> F:
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if rank_zero_only.rank == 0:  # type: ignore[attr-defined]
            return fn(*args, **kwargs)
        return None

    return wrapped  # type: ignore[return-value]


def next_version(root: Path) -> int:
    """The next free `version_N` under `root` (0 when there is none)."""
    if not root.is_dir():
        return 0
    found = [int(p.name.split("_", 1)[1]) for p in root.iterdir()
             if p.is_dir() and p.name.startswith("version_") and p.name.split("_", 1)[1].isdigit()]
    return max(found) + 1 if found else 0


def flatten_hparams(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts → 'a/b' keys; non-primitive values → their repr (loggers take scalars and strings)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_hparams(value, f"{name}/"))
        elif isinstance(value, (int, float, str, bool)):
            out[name] = value
        else:
            out[name] = repr(value)
    return out


class Logger(ABC):
    """Receives metrics and hyperparameters from the Trainer. Only rank 0 writes.

    Subclasses implement `_log_metrics`, `_log_hyperparams` and may override `_finalize` / `_save`.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("log_metrics", "log_hyperparams", "finalize", "save"):
            if name in cls.__dict__:
                setattr(cls, name, _rank_zero_method(cls.__dict__[name]))

    @property
    @abstractmethod
    def name(self) -> str: ...

    @property
    @abstractmethod
    def version(self) -> int | str: ...

    @property
    def save_dir(self) -> str | None:
        return None

    @property
    def log_dir(self) -> str | None:
        return None

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    @abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any]) -> None: ...

    def save(self) -> None:  # noqa: B027 - loggers without buffers need nothing here
        """Flush buffered output."""

    def finalize(self, status: str) -> None:
        """The run ended ('success' or 'failed'); flush and close."""
        self.save()
