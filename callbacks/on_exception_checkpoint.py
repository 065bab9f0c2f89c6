"""OnExceptionCheckpoint: save a checkpoint when fit stops with an exception (Lightning's callback)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from callbacks.base import Checkpoint
from strategies.checkpoint_io.filesystem import join, to_path
from strategies.exceptions import ConfigError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class OnExceptionCheckpoint(Checkpoint):
    """Write `<dirpath>/<filename>.ckpt` when fit ends with an exception, to resume from it later
    (`fit(ckpt_path=callback.ckpt_path)`); a run that ends well removes it (a stale one from an earlier failure).

    Saving is a collective, and after an exception the other ranks may be elsewhere or gone, so this callback runs
    with one process only; with several, `Trainer(checkpoint_on_interrupt=True)` and the preemption handling save
    together on every rank (docs/reliability.md).

    Args:
        dirpath: the folder (local or a URL), kept as given.
        filename: the file name without its extension (`FILE_EXTENSION`).

    Raises:
        ValueError: an empty `filename`.

    Example:
        ```python
        trainer = Trainer(callbacks=[OnExceptionCheckpoint(dirpath="checkpoints")])
        ```
    """

    FILE_EXTENSION = ".ckpt"
    """The extension of the file, after `filename`."""

    def __init__(self, dirpath: str | Path, filename: str = "on_exception") -> None:
        if not filename:
            raise ValueError("OnExceptionCheckpoint(filename=''): the filename cannot be empty.")
        self.dirpath = dirpath
        self.filename = filename

    @property
    def ckpt_path(self) -> str:
        return str(join(to_path(self.dirpath), self.filename + self.FILE_EXTENSION))

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if trainer.world_size > 1:
            raise ConfigError(
                "OnExceptionCheckpoint needs a single process: after an exception the other ranks cannot join the "
                "save. With several processes use Trainer(checkpoint_on_interrupt=True) and ModelCheckpoint."
            )

    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        if trainer.state.fn is not None and trainer.state.fn.value == "fit":
            trainer.save_checkpoint(self.ckpt_path)

    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if trainer.state.status != "interrupted" and stage == "fit":  # a fit that ended well: no failure to resume
            trainer.strategy.remove_checkpoint(to_path(self.ckpt_path))
