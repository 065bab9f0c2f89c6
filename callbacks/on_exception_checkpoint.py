"""OnExceptionCheckpoint: save a checkpoint when fit stops with an exception (Lightning's callback)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from callbacks.base import Callback
from strategies.checkpoint_io.filesystem import AnyPath, join, to_path
from strategies.exceptions import ConfigError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class OnExceptionCheckpoint(Callback):
    """Write `<dirpath>/<filename>.ckpt` when a run ends with an exception, to resume from it later
    (`fit(ckpt_path=callback.ckpt_path)`).

    Saving is a collective, and after an exception the other ranks may be elsewhere or gone, so this callback runs
    with one process only; with several, `Trainer(checkpoint_on_interrupt=True)` and the preemption handling save
    together on every rank (docs/reliability.md).

    Example:
        ```python
        trainer = Trainer(callbacks=[OnExceptionCheckpoint(dirpath="checkpoints")])
        ```
    """

    def __init__(self, dirpath: str | Path, filename: str = "on_exception") -> None:
        self.dirpath: AnyPath = to_path(dirpath)
        self.filename = filename

    @property
    def ckpt_path(self) -> str:
        return str(join(self.dirpath, f"{self.filename}.ckpt"))

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if trainer.world_size > 1:
            raise ConfigError(
                "OnExceptionCheckpoint needs a single process: after an exception the other ranks cannot join the "
                "save. With several processes use Trainer(checkpoint_on_interrupt=True) and ModelCheckpoint."
            )

    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        if trainer.state.fn is not None and trainer.state.fn.value == "fit":
            trainer.save_checkpoint(self.ckpt_path)
