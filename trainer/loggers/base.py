"""Logger base class. Rank-zero gating happens here once: subclasses write without checking ranks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from strategies.distributed import rank_zero_only

F = TypeVar("F", bound=Callable[..., Any])


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

    Subclasses implement `name`, `version`, `log_metrics` and `log_hyperparams`, and may override `save`,
    `finalize`, `save_dir` and `log_dir`. The four writing methods of every subclass are wrapped in
    `rank_zero_only` when the class is created, so a subclass writes without checking ranks.

    Example:
        ```python
        class PrintLogger(Logger):
            name, version = "print", 0

            def log_metrics(self, metrics, step=None):
                print(step, metrics)

            def log_hyperparams(self, params):
                print(params)
        ```
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("log_metrics", "log_hyperparams", "finalize", "save"):
            if name in cls.__dict__:
                setattr(cls, name, rank_zero_only(cls.__dict__[name]))

    @property
    @abstractmethod
    def name(self) -> str:
        """The experiment name (a folder name for file-based loggers)."""

    @property
    @abstractmethod
    def version(self) -> int | str:
        """The run's version: an int N for `version_N` folders, or a string used as the folder name."""

    @property
    def save_dir(self) -> str | None:
        """The root folder the logger writes under, or None for loggers that write no files."""
        return None

    @property
    def log_dir(self) -> str | None:
        """The folder of this run's files (`trainer.log_dir` when it is the first logger), or None."""
        return None

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Record scalar metrics at `step` (the global step); epoch metrics carry an `epoch` key."""

    @abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Record the run's hyperparameters (the module's and datamodule's `hparams`), once at fit start."""

    def save(self) -> None:  # noqa: B027 - loggers without buffers need nothing here
        """Flush buffered output."""

    def finalize(self, status: str) -> None:
        """The run ended ('success' or 'failed'); flush and close."""
        self.save()


class VersionedFolderLogger(Logger):
    """A logger writing under `save_dir/name/version_N` (N = next free one unless `version` is given)."""

    def __init__(self, save_dir: str | Path, name: str, version: int | str | None = None) -> None:
        self._save_dir = Path(save_dir)
        self._name = name
        self._version = version

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> int | str:
        if self._version is None:
            self._version = next_version(self._save_dir / self._name)
        return self._version

    @property
    def save_dir(self) -> str:
        return str(self._save_dir)

    @property
    def log_dir(self) -> str:
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return str(self._save_dir / self._name / version)
