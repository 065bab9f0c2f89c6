"""The Trainer's read-only state: the flags it was built with and what a user reads during and after a run.

Kept apart from trainer.py so that file stays about running; everything here only reads attributes the
Trainer sets (`_spec`, `strategy`, `_progress`, `_metrics`, `_schedule`, `_loaders`, `state`, `callbacks`).
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.state import RunningStage


class TrainerProperties:
    """Mixed into Trainer: Lightning's read-only properties, each a one-line view of the run's state."""

    _spec: Any
    strategy: Any
    state: Any
    callbacks: list[Any]
    loggers: list[Any]
    _progress: Any
    _metrics: Any
    _schedule: Any
    _loaders: Any
    _module: Any

    # --- flags users read ---------------------------------------------------------------------------
    max_epochs = property(lambda self: self._spec.max_epochs)
    min_epochs = property(lambda self: self._spec.min_epochs)
    max_steps = property(lambda self: self._spec.max_steps)
    accumulate_grad_batches = property(lambda self: self._spec.accumulate_grad_batches)
    gradient_clip_val = property(lambda self: self._spec.gradient_clip_val)
    gradient_clip_algorithm = property(lambda self: self._spec.gradient_clip_algorithm)
    check_val_every_n_epoch = property(lambda self: self._spec.check_val_every_n_epoch)
    val_check_interval = property(lambda self: self._spec.val_check_interval)
    log_every_n_steps = property(lambda self: self._spec.log_every_n_steps)
    fast_dev_run = property(lambda self: self._spec.fast_dev_run)
    default_root_dir = property(lambda self: str(self._spec.default_root_dir))
    precision = property(lambda self: self._spec.precision)
    num_nodes = property(lambda self: self._spec.num_nodes)
    num_devices = property(lambda self: len(self._spec.devices))

    # --- state users read ---------------------------------------------------------------------------
    @property
    def global_step(self) -> int:
        return self._progress.global_step

    @property
    def current_epoch(self) -> int:
        return self._progress.current_epoch

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        return self._metrics.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, Any]:
        return self._metrics.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        return self._metrics.progress_bar_metrics

    global_rank = property(lambda self: self.strategy.global_rank)
    local_rank = property(lambda self: self.strategy.local_rank)
    node_rank = property(lambda self: self.strategy.node_rank)
    world_size = property(lambda self: self.strategy.world_size)
    is_global_zero = property(lambda self: self.strategy.is_global_zero)

    @property
    def should_stop(self) -> bool:
        return self._schedule.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self._schedule.should_stop = bool(value)

    @property
    def logger(self) -> Any:
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        """The first logger's versioned folder, or default_root_dir without a logger."""
        return str(self.logger.log_dir) if self.logger is not None else self.default_root_dir

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        from callbacks.checkpoint import ModelCheckpoint

        return [cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> Any:
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def early_stopping_callback(self) -> Any:
        from callbacks.early_stopping import EarlyStopping

        found = [cb for cb in self.callbacks if isinstance(cb, EarlyStopping)]
        return found[0] if found else None

    @property
    def lightning_module(self) -> Any:
        return self._module

    @property
    def _module_or_none(self) -> Any:
        return self._module

    @property
    def num_training_batches(self) -> int | float:
        return self._schedule.num_training_batches

    @property
    def num_val_batches(self) -> list[int | float]:
        return list(self._loaders.val_limits)

    @property
    def sanity_checking(self) -> bool:
        return self.state.stage == RunningStage.SANITY_CHECKING

    @property
    def training(self) -> bool:
        return self.state.stage == RunningStage.TRAINING

    @property
    def train_dataloader(self) -> Any:
        return self._loaders.train
