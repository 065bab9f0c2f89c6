"""The Trainer's read-only state: the flags it was built with and what a user reads during and after a run.

Kept apart from trainer.py so that file stays about running; everything here reads the Trainer's public
attributes (`fit_state`, `strategy`, `state`, `callbacks`, `loggers`): what callbacks need is public here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from strategies.comm.distributed import rank_zero_info
from strategies.exceptions import MisconfigurationError
from trainer.setup.loaded_classes import instances_of
from trainer.state import RunningStage

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from trainer.core.optimizer_setup import SchedulerConfig
    from trainer.loops.fit_state import FitState
    from trainer.loops.predictions import PredictLoop
    from trainer.metrics.routing import MetricsRouter


class TrainerProperties:
    """Mixed into Trainer: Lightning's read-only properties, each a one-line view of the run's state."""

    fit_state: FitState
    init_flags: dict[str, Any]
    strategy: Any
    state: Any
    callbacks: list[Any]
    loggers: list[Any]

    # --- flags users read ---------------------------------------------------------------------------
    max_epochs = property(lambda self: self.fit_state.spec.max_epochs)
    """The `max_epochs` flag as resolved (1000 when no limit was given, -1 when only steps or time limit)."""
    min_epochs = property(lambda self: self.fit_state.spec.min_epochs)
    """The `min_epochs` flag."""
    max_steps = property(lambda self: self.fit_state.spec.max_steps)
    """The `max_steps` flag (-1: no step limit)."""
    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step: the flag, or what a callback set (GradientAccumulationScheduler)."""
        return self.fit_state.schedule.accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        """Settable, as in Lightning; the loop reads it at each batch, so set it in `on_train_epoch_start`: the
        accumulation windows are counted from each epoch's first batch."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MisconfigurationError(f"trainer.accumulate_grad_batches = {value!r}: use an int >= 1.")
        self.fit_state.schedule.accumulate_grad_batches = value

    gradient_clip_val = property(lambda self: self.fit_state.spec.gradient_clip_val)
    """The clipping threshold, or None."""
    @property
    def gradient_clip_algorithm(self) -> str | None:
        """`"norm"` or `"value"` as given to the Trainer; None when not given (clipping then goes by norm), as in
        Lightning, which passes it so to `configure_gradient_clipping`."""
        return None if self.init_flags.get("gradient_clip_algorithm") is None else \
            self.fit_state.spec.gradient_clip_algorithm
    check_val_every_n_epoch = property(lambda self: self.fit_state.spec.check_val_every_n_epoch)
    """Validate every N epochs (None: count `val_check_interval` batches across epochs)."""
    val_check_interval = property(lambda self: self.fit_state.spec.val_check_interval)
    """Validation cadence: a fraction of an epoch (float), a batch count (int) or a wall-clock time (timedelta)."""
    overfit_batches = property(lambda self: self.fit_state.spec.overfit_batches)
    """The `overfit_batches` flag (0: off)."""
    barebones = property(lambda self: self.fit_state.spec.barebones)
    """The `barebones` flag: whether everything that may cost speed is off."""
    log_every_n_steps = property(lambda self: self.fit_state.spec.log_every_n_steps)
    """How often step metrics go to the loggers."""
    fast_dev_run = property(lambda self: self.init_flags["fast_dev_run"] == 1 or self.init_flags["fast_dev_run"])
    """The `fast_dev_run` flag as Lightning keeps it: True for True or 1, else the number of batches (or False)."""
    limit_train_batches = property(lambda self: self.fit_state.spec.limit_train_batches)
    """Training batches per epoch: an int count or a float fraction (fast_dev_run and overfit_batches set it)."""
    limit_val_batches = property(lambda self: self.fit_state.spec.limit_val_batches)
    """Validation batches per loader: an int count or a float fraction."""
    limit_test_batches = property(lambda self: self.fit_state.spec.limit_test_batches)
    """Test batches per loader: an int count or a float fraction."""
    limit_predict_batches = property(lambda self: self.fit_state.spec.limit_predict_batches)
    """Predict batches per loader: an int count or a float fraction."""
    min_steps = property(lambda self: self.init_flags["min_steps"])
    """The `min_steps` flag (None: no minimum)."""
    num_sanity_val_steps = property(lambda self: math.inf if self.fit_state.spec.num_sanity_val_steps == -1
                                    else self.fit_state.spec.num_sanity_val_steps)
    """Validation batches per loader in the sanity check (`inf`: all; 0 with fast_dev_run or barebones)."""
    reload_dataloaders_every_n_epochs = property(lambda self: self.fit_state.spec.reload_dataloaders_every_n_epochs)
    """Request the fit's loaders again every N epochs (0: once)."""
    enable_autolog_hparams = property(lambda self: self.fit_state.spec.enable_autolog_hparams)
    """Whether the module's and datamodule's hyperparameters go to the loggers at fit start."""
    default_root_dir = property(lambda self: str(self.fit_state.spec.default_root_dir))
    """Where logs and checkpoints go (the current directory by default)."""
    precision = property(lambda self: self.fit_state.spec.precision)
    """The canonical precision name, e.g. `"32-true"` or `"bf16-mixed"` (aliases such as `16` resolved)."""
    num_nodes = property(lambda self: self.fit_state.spec.num_nodes)
    """The number of machines."""
    num_devices = property(lambda self: len(self.fit_state.spec.devices))
    """The number of devices (processes) per machine."""
    checkpoint_on_interrupt = property(lambda self: self.fit_state.spec.checkpoint_on_interrupt)
    """The `checkpoint_on_interrupt` flag: whether Ctrl-C saves a checkpoint before the run stops."""

    # --- state users read ---------------------------------------------------------------------------
    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (in manual optimization: `optimizer.step()` calls)."""
        return self.fit_state.progress.global_step

    @property
    def current_epoch(self) -> int:
        """The current epoch, counted from 0; after fit, the number of epochs run."""
        return self.fit_state.progress.current_epoch

    @property
    def metrics_router(self) -> MetricsRouter:
        """Where logged values go, and the owner of the `log_every_n_steps` cadence: a callback that measures
        values itself (as `LearningRateMonitor` does) asks it when to log and sends them through it."""
        return self.fit_state.metrics

    @property
    def callback_metrics(self) -> dict[str, torch.Tensor]:
        """Every logged value as a tensor: the latest step values and the epoch values."""
        return self.fit_state.metrics.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, Any]:
        """What was last sent to the loggers, as floats."""
        return self.fit_state.metrics.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, float]:
        """Values logged with `prog_bar=True`, as floats."""
        return self.fit_state.metrics.progress_bar_metrics

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
        return self.fit_state.schedule.should_stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.fit_state.schedule.should_stop = bool(value)

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
        return instances_of(self.callbacks, "callbacks.checkpoint", "ModelCheckpoint")

    @property
    def checkpoint_callback(self) -> Any:
        """The first ModelCheckpoint, or None."""
        found = self.checkpoint_callbacks
        return found[0] if found else None

    @property
    def early_stopping_callbacks(self) -> list[Any]:
        """Every EarlyStopping among the callbacks."""
        return instances_of(self.callbacks, "callbacks.early_stopping", "EarlyStopping")

    @property
    def early_stopping_callback(self) -> Any:
        """The first EarlyStopping callback, or None."""
        found = instances_of(self.callbacks, "callbacks.early_stopping", "EarlyStopping")
        return found[0] if found else None

    @property
    def lightning_module(self) -> Any:
        """The TrainModule being run (Lightning's name for it)."""
        return self.fit_state.module

    @property
    def model(self) -> Any:
        """The module as the strategy wrapped it (DDP, DataParallel, the FSDP2-sharded module); the TrainModule
        itself with one device. Before a run: the attached TrainModule (None before the first one)."""
        try:
            return self.strategy.wrapped_module
        except RuntimeError:  # the strategy has not set a module up yet
            return self.fit_state.module

    @property
    def progress_bar_callback(self) -> Any:
        """The progress bar callback (ProgressBar, RichProgressBar or another ProgressBarBase), or None."""
        found = instances_of(self.callbacks, "callbacks.progress_base", "ProgressBarBase")
        return found[0] if found else None

    @property
    def num_training_batches(self) -> int | float:
        """Training batches per epoch after `limit_train_batches` (`inf` for a loader without length)."""
        return self.fit_state.schedule.num_training_batches

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps the fit will take (Lightning's estimate): `max_steps` when it binds, else the training
        batches per epoch (per rank, after `limit_train_batches`) over `accumulate_grad_batches`, rounded up, times
        `max_epochs`; `inf` with no limit. Known once fit() has the training data: read it in
        `configure_optimizers` (e.g. for OneCycleLR's `total_steps`) or later."""
        spec = self.fit_state.spec
        if spec.max_epochs == -1:
            return math.inf if spec.max_steps == -1 else spec.max_steps
        loaders = self.fit_state.loaders
        if "train" not in loaders.loaded:
            if not loaders.defined("train"):
                raise MisconfigurationError(
                    "estimated_stepping_batches needs the training data: read it during fit() (in "
                    "configure_optimizers or a later hook), not before."
                )
            rank_zero_info("Requesting the training loaders to estimate the number of stepping batches.")
            self.fit_state.request_train()  # as Lightning does; the fit then keeps these loaders
        if loaders.num_train == math.inf:
            return spec.max_steps if spec.max_steps != -1 else math.inf
        steps = math.ceil(loaders.num_train / self.accumulate_grad_batches) * max(spec.max_epochs, 1)
        return min(steps, spec.max_steps) if spec.max_steps != -1 else steps

    @property
    def num_val_batches(self) -> list[int | float]:
        """Validation batches per loader after `limit_val_batches` (each iterable of a CombinedLoader counts)."""
        return list(self.fit_state.loaders.counts.get("val", []))

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
        """The training loader(s) of the fit, as the Trainer uses them (a distributed sampler injected where needed),
        in the shape they were given (one loader, a list or a dict); None before they are requested."""
        return self.fit_state.loaders.collections.get("train")

    @property
    def val_dataloaders(self) -> Any:
        """The validation loader(s) of the current or last run, in the shape given; None before they are requested."""
        return self.fit_state.loaders.collections.get("val")

    @property
    def test_dataloaders(self) -> Any:
        """The test loader(s) of the current or last `test()`, in the shape given; None before they are requested."""
        return self.fit_state.loaders.collections.get("test")

    @property
    def predict_dataloaders(self) -> Any:
        """The predict loader(s) of the current or last `predict()`, in the shape given; None before requested."""
        return self.fit_state.loaders.collections.get("predict")

    @property
    def total_batches(self) -> int:
        """Training batches finished over the whole fit, across epochs and resumes (the count that
        `log_every_n_steps` runs on; `global_step` counts optimizer steps instead)."""
        return self.fit_state.progress.total_batches

    @property
    def num_sanity_val_batches(self) -> list[int | float]:
        """Sanity-check batches per validation loader (`num_sanity_val_steps`, capped by each loader's limit); empty
        outside fit, as in Lightning."""
        if self.state.fn is None or self.state.fn.value != "fit":
            return []
        schedule = self.fit_state.schedule
        return [schedule.sanity_steps(n) for n in self.fit_state.loaders.counts.get("val", [])]

    @property
    def num_test_batches(self) -> list[int | float]:
        """Test batches per loader after `limit_test_batches`."""
        return list(self.fit_state.loaders.counts.get("test", []))

    @property
    def num_predict_batches(self) -> list[int | float]:
        """Predict batches per loader after `limit_predict_batches`."""
        return list(self.fit_state.loaders.counts.get("predict", []))

    @property
    def predict_loop(self) -> PredictLoop:
        """The predict run's predictions and batch indices, as a `BasePredictionWriter` reads them (Lightning's
        `trainer.predict_loop`: `predictions`, `current_batch_indices`, `epoch_batch_indices`, `return_predictions`)."""
        return self.fit_state.predict_loop

    @property
    def validating(self) -> bool:
        """True while a validation runs (during fit, or `validate()`), the sanity check excluded."""
        return self.state.stage == RunningStage.VALIDATING

    @property
    def testing(self) -> bool:
        """True while `test()` runs."""
        return self.state.stage == RunningStage.TESTING

    @property
    def predicting(self) -> bool:
        """True while `predict()` runs."""
        return self.state.stage == RunningStage.PREDICTING

    @property
    def optimizers(self) -> list[Optimizer]:
        """The optimizers of the current fit, as the strategy set them up (e.g. ZeRO-1's sharded ones)."""
        return self.fit_state.optimizers

    @property
    def lr_scheduler_configs(self) -> list[SchedulerConfig]:
        """The schedulers from `configure_optimizers()`, with their interval, frequency and monitor."""
        return self.fit_state.lr_scheduler_configs
