"""Logger base class. Rank-zero gating happens here once: subclasses write without checking ranks.

The folder contract: a logger that keeps this run's files in a folder of its own (TensorBoard, CSV) returns it
from `log_dir`; a logger that does not (MLflow sends to a tracking server, W&B keeps its own layout) returns
None there and names its run with `name` and `version` instead. `run_folder` turns either into the folder where
the run's other files go (default checkpoints, the CLI's saved config), so a folderless logger never yields a
folder called 'None'.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from strategies.checkpoint_io.filesystem import AnyPath, join, list_names, to_path
from strategies.comm.distributed import rank_zero_only

if TYPE_CHECKING:
    from callbacks.checkpoint import ModelCheckpoint

F = TypeVar("F", bound=Callable[..., Any])


def next_version(root: AnyPath) -> int:
    """The next free `version_N` under `root` (0 when there is none)."""
    names = list_names(root, directories_only=True)
    found = [int(n.split("_", 1)[1]) for n in names if n.startswith("version_") and n.split("_", 1)[1].isdigit()]
    return max(found) + 1 if found else 0


def claim_version(root: AnyPath) -> int:
    """Claim the next free `version_N` under `root` by creating it: an exclusive mkdir, so two runs started at once
    (processes on one machine, or machines sharing a filesystem) never get the same folder. An object store has
    no folders and no exclusive create: there the next free number is taken as it is (docs/reliability.md)."""
    version = next_version(root)
    if not isinstance(root, Path):
        return version
    root.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            (root / f"version_{version}").mkdir()
            return version
        except FileExistsError:
            version += 1


def run_folder(logger: Logger, default_root_dir: str | Path) -> AnyPath:
    """Where this run's files go besides the logger's own (the default checkpoint folder's parent, Lightning's
    rule): `<save_dir or default_root_dir>/<name>/<version>`, `version_N` for an int version. For TensorBoard and CSV
    this is their `log_dir` (without TensorBoard's `sub_dir`); for MLflow `<root>/<experiment id>/<run id>`."""
    base = to_path(logger.save_dir) if logger.save_dir else to_path(default_root_dir)
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return join(base, *(part for part in (str(logger.name or ""), version) if part))


def add_prefix(metrics: Mapping[str, Any], prefix: str, separator: str) -> Mapping[str, Any]:
    """`metrics` with `prefix` + `separator` before every key (unchanged without a prefix)."""
    if not prefix:
        return metrics
    return {f"{prefix}{separator}{key}": value for key, value in metrics.items()}


class DummyExperiment:
    """What `experiment` is on a rank other than 0: every method call does nothing, so a module's
    `logger.experiment.add_image(...)` runs on every rank and writes once (Lightning's `rank_zero_experiment`)."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None

    def __getitem__(self, index: int) -> DummyExperiment:
        return self

    def __setitem__(self, *args: Any) -> None:
        pass


def rank_zero_experiment(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """For an `experiment` property: the real object on global rank 0, a `DummyExperiment` on the others (no run
    folder or writer is made there)."""

    @functools.wraps(fn)
    def experiment(self: Any) -> Any:
        return fn(self) if rank_zero_only.rank == 0 else DummyExperiment()  # type: ignore[attr-defined]

    return experiment


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
    `finalize`, `save_dir`, `log_dir`, `log_artifact`, `after_save_checkpoint`, `identity` and
    `adopt_identity`. The writing methods of every subclass are wrapped in `rank_zero_only` when the class is
    created, so a subclass writes without checking ranks.

    A logger without a folder of its own returns None from `log_dir` (and from `save_dir` unless it has a local
    root): `trainer.log_dir` is then `default_root_dir`, and the default checkpoint folder is
    `<save_dir or default_root_dir>/<name>/<version>/checkpoints` (see `run_folder`).

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

    WRITERS = ("log_metrics", "log_hyperparams", "log_graph", "finalize", "save", "log_artifact",
               "after_save_checkpoint")

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in cls.WRITERS:
            if name in cls.__dict__:
                setattr(cls, name, rank_zero_only(cls.__dict__[name]))

    @property
    @abstractmethod
    def name(self) -> str | None:
        """The experiment name (a folder name for file-based loggers); None while not known yet (a tracking logger
        on a rank other than 0, before rank 0 created the run), as Lightning's `Logger.name` allows."""

    @property
    @abstractmethod
    def version(self) -> int | str | None:
        """The run's version: an int N for `version_N` folders, or a string used as the folder name; None while
        not known yet, as for `name`."""

    @property
    def save_dir(self) -> str | None:
        """The root folder the logger writes under (local or a URL), or None for loggers that write no files."""
        return None

    @property
    def log_dir(self) -> str | None:
        """The folder of this run's files (`trainer.log_dir` when it is the first logger), or None when the
        logger keeps no folder of its own."""
        return None

    @property
    def root_dir(self) -> str | None:
        """The folder that holds this logger's versions (`save_dir/name`), or None without one."""
        return None

    @property
    def group_separator(self) -> str:
        """What separates a metric's group from its name in this logger's display (`train/loss`)."""
        return "/"

    @abstractmethod
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Record scalar metrics at `step` (the global step); epoch metrics carry an `epoch` key."""

    @abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Record the run's hyperparameters (the module's and datamodule's `hparams`), once at fit start."""

    def log_graph(self, model: Any, input_array: Any = None) -> None:  # noqa: B027 - most loggers draw no graph
        """Record the model's computational graph (TensorBoardLogger with `log_graph=True`); called at fit start."""

    def save(self) -> None:  # noqa: B027 - loggers without buffers need nothing here
        """Flush buffered output."""

    def finalize(self, status: str) -> None:
        """The run ended ('success' or 'failed'); flush and close."""
        self.save()

    def log_artifact(self, local_path: str, artifact_path: str | None = None) -> None:  # noqa: B027
        """Keep a copy of a local file with the run (MLflow artifacts, W&B run files); by default nothing, for
        loggers whose folder already holds the run's files. The CLI sends the resolved config here."""

    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:  # noqa: B027
        """Called after `checkpoint_callback` saved (Lightning's hook): e.g. upload new checkpoints as artifacts."""

    def identity(self) -> Any:
        """What names this run (a version, a run id), for the other processes of the run: rank 0's value is sent to
        the other ranks at the start of every fit/validate/test/predict, and a spawned rank 0's value back to the
        launching process. Called on rank 0 only; may create the run. None: nothing to share."""
        return None

    def adopt_identity(self, identity: Any) -> None:  # noqa: B027
        """Take the run identity rank 0 chose (see `identity`), so every process names the same run."""


class DummyLogger(Logger):
    """The loggers' stand-in under `fast_dev_run`, as Lightning's: nothing is written and no run folder is made, while
    a module's `self.logger.experiment.add_image(...)` (any call on `experiment`) still runs and does nothing."""

    @property
    def experiment(self) -> DummyExperiment:
        return DummyExperiment()

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        pass

    def __getitem__(self, index: int) -> DummyLogger:  # `trainer.logger[0]` in code written for a logger list
        return self


class VersionedFolderLogger(Logger):
    """A logger writing under `save_dir/name/version_N` (N = next free one unless `version` is given); a `name` of
    None or "" puts the versions straight under `save_dir`.

    The free version is claimed by creating its folder (see `claim_version`) when rank 0 first asks for it.
    `save_dir` may be an fsspec URL (`s3://bucket/logs`, `memory://logs`). `prefix` goes before every metric key,
    joined by `LOGGER_JOIN_CHAR`.
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(self, save_dir: str | Path, name: str | None, version: int | str | None = None,
                 prefix: str = "") -> None:
        self._save_dir = to_path(save_dir)
        self._name = name or ""
        self._version = version
        self._prefix = prefix

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> int | str:
        if self._version is None:
            self._version = claim_version(to_path(self.root_dir))
        return self._version

    @property
    def save_dir(self) -> str:
        return str(self._save_dir)

    @property
    def root_dir(self) -> str:
        """`save_dir/name` (`save_dir` without a name): the folder of the versions."""
        return str(join(self._save_dir, self.name)) if self.name else str(self._save_dir)

    @property
    def log_dir(self) -> str:
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return str(join(to_path(self.root_dir), version))

    def identity(self) -> Any:
        return self.version

    def adopt_identity(self, identity: Any) -> None:
        if identity is not None:
            self._version = identity  # log_dir then names the folder rank 0 chose

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        state["_experiment"] = None  # a writer does not pickle (ddp_spawn sends the loggers); it reopens on use
        return state
