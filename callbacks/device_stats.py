"""DeviceStatsMonitor: Lightning's callback that logs the device's statistics around every batch.

On CPU the statistics are psutil's (`cpu_vm_percent`, `cpu_percent`, `cpu_swap_percent`); on CUDA they are
`torch.cuda.memory_stats(device)` (allocated, reserved and active bytes, allocator events), plus psutil's with
`cpu_stats=True`. Each key is logged as `DeviceStatsMonitor.<hook>/<stat>` (the logger's `group_separator`,
"/" by default) at the batch hooks of training, validation and test, on the log cadence of
callbacks/log_cadence.py, at Lightning's step (the batches that stepped the optimizer so far).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from callbacks.log_cadence import LogCadence
from strategies.exceptions import MisconfigurationError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


def cpu_stats() -> dict[str, float]:
    """psutil's system-wide memory, CPU and swap use, in percent (Lightning's key names)."""
    try:
        import psutil  # imported here: only this callback needs it
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError("DeviceStatsMonitor logs CPU statistics with psutil: `pip install psutil`, or "
                                  "pass cpu_stats=False on a GPU.") from error
    return {"cpu_vm_percent": psutil.virtual_memory().percent, "cpu_percent": psutil.cpu_percent(),
            "cpu_swap_percent": psutil.swap_memory().percent}


class DeviceStatsMonitor(Callback):
    """Log device statistics to the Trainer's loggers around every training, validation and test batch.

    Args:
        cpu_stats: None logs psutil's CPU statistics only when training on CPU; True also on a GPU; False never
            (on CPU it then logs nothing).

    Raises:
        MisconfigurationError: at fit start, when the Trainer has no logger.
        ModuleNotFoundError: when CPU statistics are asked for and psutil is not installed.

    Example:
        ```python
        trainer = Trainer(callbacks=[DeviceStatsMonitor()], log_every_n_steps=10)
        ```
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        self._cpu_stats = cpu_stats
        self._cadence = LogCadence()

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise MisconfigurationError("DeviceStatsMonitor needs a logger: remove it or pass Trainer(logger=True) "
                                        "(it cannot be used with Trainer(logger=False)).")
        if self._cpu_stats is None and trainer.strategy.root_device.type == "cpu":
            cpu_stats()  # psutil missing is an error now, not at the first logged batch

    def _log(self, trainer: Trainer, hook: str, due: bool) -> None:
        if not due:
            return
        device = trainer.strategy.root_device
        if device.type == "cpu":
            if self._cpu_stats is False:
                return
            stats: dict[str, Any] = cpu_stats()
        elif device.type == "cuda":
            stats = dict(torch.cuda.memory_stats(device))
            if self._cpu_stats:
                stats.update(cpu_stats())
        else:
            stats = cpu_stats() if self._cpu_stats else {}
        for logger in trainer.loggers:
            separator = getattr(logger, "group_separator", "/")
            prefix = f"{type(self).__qualname__}.{hook}{separator}"
            logger.log_metrics({prefix + key: value for key, value in stats.items()},
                               step=trainer.metrics_router.logging_step)

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        self._cadence.train_batch_started(trainer, pl_module)
        self._log(trainer, "on_train_batch_start", self._cadence.train_due(trainer))

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._log(trainer, "on_train_batch_end", self._cadence.train_due(trainer))

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._cadence.eval_run_started()

    def on_validation_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self._cadence.eval_batch_started()
        self._log(trainer, "on_validation_batch_start", self._cadence.eval_due(trainer))

    def on_validation_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_validation_batch_end", self._cadence.eval_due(trainer))

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._cadence.eval_run_started()

    def on_test_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._cadence.eval_batch_started()
        self._log(trainer, "on_test_batch_start", self._cadence.eval_due(trainer))

    def on_test_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_test_batch_end", self._cadence.eval_due(trainer))
