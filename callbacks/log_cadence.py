"""When a callback that measures values itself (ThroughputMonitor, DeviceStatsMonitor) sends them to the loggers.

Lightning's rule for such callbacks, which is not the `self.log` cadence: in training, a batch logs when its
optimizer step is a multiple of `log_every_n_steps` (the steps taken before the batch, plus one; under manual
optimization every batch counts as a step); in validation, test and prediction, every `log_every_n_steps`-th
batch of the run; and any batch once the run is stopping. `log_every_n_steps=0` logs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class LogCadence:
    """Call `train_batch_started` / `eval_run_started` / `eval_batch_started` from the matching hooks, then ask
    `train_due` or `eval_due`."""

    def __init__(self) -> None:
        self._steps_before = 0
        self._eval_batches = 0

    def train_batch_started(self, trainer: Trainer, pl_module: TrainModule) -> None:
        automatic = getattr(pl_module, "automatic_optimization", True)
        self._steps_before = trainer.global_step if automatic else trainer.total_batches

    def eval_run_started(self) -> None:
        self._eval_batches = 0

    def eval_batch_started(self) -> None:
        self._eval_batches += 1

    def train_due(self, trainer: Trainer) -> bool:
        return self._due(trainer, self._steps_before + 1)

    def eval_due(self, trainer: Trainer) -> bool:
        return self._due(trainer, self._eval_batches)

    @staticmethod
    def _due(trainer: Trainer, count: int) -> bool:
        every = trainer.log_every_n_steps
        return every > 0 and (count % every == 0 or trainer.should_stop)
