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
    """The `max_epochs` flag as resolved (1000 when no limit was given, -1 when only steps or time limit)."""
    min_epochs = property(lambda self: self._spec.min_epochs)
    """The `min_epochs` flag."""
    max_steps = property(lambda self: self._spec.max_steps)
    """The `max_steps` flag (-1: no step limit)."""
    accumulate_grad_batches = property(lambda self: self._spec.accumulate_grad_batches)
    """Batches per optimizer step."""
    gradient_clip_val = property(lambda self: self._spec.gradient_clip_val)
    """The clipping threshold, or None."""
    gradient_clip_algorithm = property(lambda self: self._spec.gradient_clip_algorithm)
    """`"norm"` or `"value"`."""
    check_val_every_n_epoch = property(lambda self: self._spec.check_val_every_n_epoch)
    """Validate every N epochs (None: count `val_check_interval` batches across epochs)."""
    val_check_interval = property(lambda self: self._spec.val_check_interval)
    """Validation cadence within an epoch: a fraction of it (float) or a batch count (int)."""
    log_every_n_steps = property(lambda self: self._spec.log_every_n_steps)
    """How often step metrics go to the loggers."""
    fast_dev_run = property(lambda self: self._spec.fast_dev_run)
    """The `fast_dev_run` flag."""
    default_root_dir = property(lambda self: str(self._spec.default_root_dir))
    """Where logs and checkpoints go (the current directory by default)."""
    precision = property(lambda self: self._spec.precision)
    """The canonical precision name, e.g. `"32-true"` or `"bf16-mixed"` (aliases such as `16` resolved)."""
    num_nodes = property(lambda self: self._spec.num_nodes)
    """The number of machines."""
    num_devices = property(lambda self: len(self._spec.devices))
    """The number of devices (processes) per machine."""

    # --- state users read ---------------------------------------------------------------------------
    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (in manual optimization: `optimizer.step()` calls)."""
        return self._progress.global_step

    @property
    def current_epoch(self) -> int:
        """The current epoch, counted from 0; after fit, the number of epochs run."""
        return self._progress.current_epoch

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """Every logged value as a tensor: the latest step values and the epoch values."""
        return self._metrics.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, Any]:
        """What was last sent to the loggers, as floats."""
        return self._metrics.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """Values logged with `prog_bar=True`, as floats."""
        return self._metrics.progress_bar_metrics

    global_rank = property(lambda self: self.strategy.global_rank)
    """This process's rank among all processes."""
    local_rank = property(lambda self: self.strategy.local_rank)
    """This process's rank on its machine."""
    node_rank = property(lambda self: self.strategy.node_rank)
    """The rank of this process's machine."""
    world_size = property(lambda self: self.strategy.world_size)
    """The number of processes."""
    is_global_zero = property(lambda self: self.strategy.is_global_zero)
    """True in the process of global rank 0, the one that writes logs and checkpoints."""

    @property
    def should_stop(self) -> bool:
        """Set it to True from a hook or callback to stop fit after the current batch (once `min_epochs` ran).

        It is not reduced across ranks for you: under DDP set it on every rank alike, as EarlyStopping does
        (it agrees on its decision with a collective first).
        """
        return self._schedule.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self._schedule.should_stop = bool(value)

    @property
    def logger(self) -> Any:
        """The first logger, or None."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        """The first logger's folder (`log_dir`); `default_root_dir` without a logger, or when the first logger
        keeps no folder of its own (MLflow, W&B: see trainer.loggers.Logger)."""
        folder = self.logger.log_dir if self.logger is not None else None
        return str(folder) if folder is not None else self.default_root_dir

    @property
    def checkpoint_callbacks(self) -> list[Any]:
        """Every ModelCheckpoint among the callbacks."""
        from callbacks.checkpoint import ModelCheckpoint

        return [cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)]

    @property
    def checkpoint_callback(self) -> Any:
        """The first ModelCheckpoint, or None."""
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def early_stopping_callback(self) -> Any:
        """The first EarlyStopping callback, or None."""
        from callbacks.early_stopping import EarlyStopping

        found = [cb for cb in self.callbacks if isinstance(cb, EarlyStopping)]
        return found[0] if found else None

    @property
    def lightning_module(self) -> Any:
        """The TrainModule being run (Lightning's name for it)."""
        return self._module

    @property
    def _module_or_none(self) -> Any:
        return self._module

    @property
    def num_training_batches(self) -> int | float:
        """Training batches per epoch after `limit_train_batches` (`inf` for a loader without length)."""
        return self._schedule.num_training_batches

    @property
    def num_val_batches(self) -> list[int | float]:
        """Validation batches per loader after `limit_val_batches`."""
        return list(self._loaders.val_limits)

    @property
    def sanity_checking(self) -> bool:
        """True while the sanity-check validation runs."""
        return self.state.stage == RunningStage.SANITY_CHECKING

    @property
    def training(self) -> bool:
        """True while training batches run."""
        return self.state.stage == RunningStage.TRAINING

    @property
    def train_dataloader(self) -> Any:
        """The training loader as the Trainer uses it (with its distributed sampler, if injected)."""
        return self._loaders.train
