"""TrainModule: the user's model, step hooks and optimizer factory (a LightningModule counterpart)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import MisconfigurationError
from trainer.checkpoint.schema import load_module_from_checkpoint
from trainer.core.data_hooks import DataHooks
from trainer.core.hparams import HyperparametersMixin
from trainer.core.log_options import check_log_options, reduce_fx_name
from trainer.core.model_hooks import MoreModelHooks
from trainer.core.module_methods import ModuleConveniences
from trainer.core.optimization_hooks import OptimizationHooks

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class TrainModule(HyperparametersMixin, OptimizationHooks, ModuleConveniences, MoreModelHooks, DataHooks, nn.Module):
    """Subclass this: define `training_step` and `configure_optimizers`, optionally the other hooks.

    Every `on_*` hook below is a no-op here; the Trainer calls them in the order documented in trainer.hooks.
    The hooks of the optimizer path (`optimizer_step`, `optimizer_zero_grad`, `backward`,
    `configure_gradient_clipping`, `lr_scheduler_step`) do the default work and may be overridden
    (trainer/core/optimization_hooks.py).
    The module never handles devices, ranks or wrappers: the same subclass runs on one device, under
    DDP or ZeRO, chosen by `Trainer(strategy=...)`.

    Attributes:
        automatic_optimization: True (the default) lets the Trainer run backward and the optimizer step;
            set it to False in `__init__` to step yourself with `self.optimizers()` and `self.manual_backward`.

    Example:
        ```python
        class Classifier(TrainModule):
            def __init__(self, lr: float = 1e-3):
                super().__init__()
                self.save_hyperparameters()
                self.net = nn.Linear(64, 10)

            def training_step(self, batch, batch_idx):
                x, y = batch
                loss = nn.functional.cross_entropy(self.net(x), y)
                self.log("train_loss", loss)
                return loss

            def configure_optimizers(self):
                return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        ```
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Trainer | None = None
        self.automatic_optimization: bool = True
        self._strict_loading: bool | None = None

    # --- properties --------------------------------------------------------------------------
    @property
    def trainer(self) -> Trainer:
        """The Trainer running this module; a RuntimeError outside fit/validate/test/predict."""
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer; call it from inside fit/validate.")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        self._trainer = trainer

    @property
    def strict_loading(self) -> bool:
        """Whether checkpoint weights must match this module's keys exactly (`fit(ckpt_path=...)`, and
        `load_from_checkpoint` when it is not given `strict`); True unless set to False, as in Lightning."""
        return self._strict_loading in (None, True)

    @strict_loading.setter
    def strict_loading(self, strict: bool) -> None:
        self._strict_loading = strict

    @property
    def device(self) -> torch.device:
        """The device of the module's first parameter (or buffer); CPU for a module without any."""
        for param in self.parameters():
            return param.device
        for buffer in self.buffers():
            return buffer.device
        return torch.device("cpu")

    @property
    def device_mesh(self) -> Any:
        """The device mesh of `strategy="model_parallel"` (`ModelParallelStrategy`), for `configure_model` to
        parallelize over: `self.device_mesh["tensor_parallel"]`, `self.device_mesh["data_parallel"]`. None under
        other strategies and without a Trainer."""
        return self._trainer.strategy.device_mesh if self._trainer is not None else None

    @property
    def global_rank(self) -> int:
        """This process's rank among all processes (0 without a Trainer)."""
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        """This process's rank on its machine (0 without a Trainer)."""
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        """The Trainer's current epoch, counted from 0 (0 without a Trainer)."""
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (0 without a Trainer)."""
        return self._trainer.global_step if self._trainer is not None else 0

    # --- steps (override) --------------------------------------------------------------------
    def training_step(self, *args: Any, **kwargs: Any) -> Tensor | Mapping[str, Any] | None:
        """Compute the loss of one batch; required for `fit`. Called as `training_step(batch, batch_idx)`.

        Returns:
            The loss as a scalar tensor, a dict with the loss under `"loss"` (other keys reach
            `on_train_batch_end`), or None to skip the optimizer step for this batch. In manual
            optimization the return value is not used for backward.
        """
        raise MisconfigurationError(
            f"{type(self).__name__} does not define training_step(batch, batch_idx); it is required for fit()."
        )

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """Optional; the Trainer skips validation when it is not overridden."""

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """Optional; required for trainer.test()."""

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        """Default: the module's forward on the batch."""
        return self(batch)

    def configure_optimizers(self) -> Any:
        """Build the optimizer(s) and LR scheduler(s); required for `fit`.

        Called after the strategy has set the module up (ZeRO-2/3 replace the parameters when they shard
        them), so build the optimizer from `self.parameters()` here, not in `__init__`.

        Returns:
            An optimizer; a list of optimizers; a tuple `(optimizers, schedulers)`; or a dict
            `{"optimizer": opt, "lr_scheduler": sched}`, where `sched` may itself be a dict with `"scheduler"`,
            `"interval"` (`"epoch"` or `"step"`), `"frequency"` and `"monitor"` (a logged metric name).
        """
        raise MisconfigurationError(
            f"{type(self).__name__} does not define configure_optimizers(); it must return an optimizer "
            "(or a list, a tuple (optimizers, schedulers), or a dict with 'optimizer' and 'lr_scheduler')."
        )

    # --- lifecycle hooks (no-ops) --------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Called on every rank at the start of fit, validate, test and predict.

        It runs after the datamodule's `setup` and before the module moves to its device.
        `stage` (passed by keyword, as Lightning does) is the `TrainerFn` of the run, a str enum equal to 'fit',
        'validate', 'test' or 'predict'.
        """

    def teardown(self, stage: str) -> None:
        """Called on every rank at the end of every run, also after an exception; `stage` as in `setup`."""

    def on_fit_start(self) -> None:
        """Called once per fit, after `configure_optimizers` and any checkpoint restore."""

    def on_fit_end(self) -> None:
        """Called once when fit finished without an exception."""

    def on_train_start(self) -> None:
        """Called after the sanity check, before the first training epoch."""

    def on_train_end(self) -> None:
        """Called after the last training epoch."""

    def on_train_epoch_start(self) -> None:
        """Called at the start of every training epoch."""

    def on_train_epoch_end(self) -> None:
        """Called at the end of every training epoch, after its validation.

        ModelCheckpoint and EarlyStopping run after this hook, so they can monitor what it logs.
        """

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        """Called before `training_step`; return -1 to end the current epoch here."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Called after `training_step`, and after the optimizer step when one was due.

        `outputs` is what `training_step` returned, as a dict with the loss detached.
        """

    def on_before_backward(self, loss: Tensor) -> None:
        """Called with the loss just before backward (not yet divided by `accumulate_grad_batches`)."""

    def on_after_backward(self) -> None:
        """Called after backward; `.grad` holds the gradients (under 16-mixed, still scaled)."""

    def on_before_optimizer_step(self, optimizer: Optimizer) -> None:
        """Called before each optimizer step, after its closure (training_step and backward) ran.

        In automatic optimization the gradients are unscaled by then, and not yet clipped.
        """

    def on_before_zero_grad(self, optimizer: Optimizer) -> None:
        """Called just before `optimizer_zero_grad`: after training_step and before backward, on the first batch of
        each accumulation window (as in Lightning)."""

    def on_validation_start(self) -> None:
        """Called at the start of every validation run, the sanity check included."""

    def on_validation_end(self) -> None:
        """Called at the end of every validation run."""

    def on_validation_epoch_start(self) -> None:
        """Called before the first validation batch."""

    def on_validation_epoch_end(self) -> None:
        """Called after the last validation batch; epoch values are already reduced."""

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before `validation_step`."""

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after `validation_step` with what it returned."""

    def on_test_start(self) -> None:
        """Called at the start of `trainer.test()`."""

    def on_test_end(self) -> None:
        """Called at the end of `trainer.test()`."""

    def on_test_epoch_start(self) -> None:
        """Called before the first test batch."""

    def on_test_epoch_end(self) -> None:
        """Called after the last test batch; epoch values are already reduced."""

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before `test_step`."""

    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after `test_step` with what it returned."""

    def on_predict_start(self) -> None:
        """Called at the start of `trainer.predict()`."""

    def on_predict_end(self) -> None:
        """Called at the end of `trainer.predict()`."""

    def on_predict_epoch_start(self) -> None:
        """Called before the first predict batch."""

    def on_predict_epoch_end(self) -> None:
        """Called after the last predict batch."""

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called before `predict_step`."""

    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Called after `predict_step` with what it returned."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Called on every rank while a checkpoint is built; add your own entries to `checkpoint`.

        Store tensors and primitives only: checkpoints are loaded with `weights_only=True`.
        """

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Called with a loaded checkpoint, after the weights were restored.

        Read back what `on_save_checkpoint` added.
        """

    # --- logging -----------------------------------------------------------------------------
    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str | Callable[..., Any] = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        metric_attribute: str | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record a metric for the loggers, the progress bar and callbacks (`trainer.callback_metrics`).

        Lightning's parameters, in Lightning's order (`self.log("x", v, True)` means `prog_bar=True`).
        Defaults follow Lightning: per step in training hooks, per epoch in evaluation hooks.

        Args:
            name: the key; with both `on_step` and `on_epoch` the logged keys are `name_step` and `name_epoch`.
            value: a number, a one-element tensor, or a `torchmetrics.Metric` (computed at epoch end, and reset
                after the epoch-end hooks, so `compute()` inside them gives the epoch value).
            prog_bar: also show it on the progress bar.
            logger: send it to the loggers (None: True).
            on_step: log the value of this step (default: True in training hooks, False in evaluation).
            on_epoch: log the epoch's reduction (default: False in training hooks, True in evaluation).
            reduce_fx: `"mean"` (weighted by batch size), `"sum"`, `"max"` or `"min"` (or `torch.mean`,
                `torch.sum`, `torch.max`, `torch.min`) for the epoch value.
            enable_graph: must stay False: logged values are detached.
            sync_dist: reduce the value across ranks first (one collective per call).
            sync_dist_group: must stay None: values are reduced over all ranks.
            add_dataloader_idx: with several evaluation loaders, append `/dataloader_idx_N` to the name (False:
                the name as given, which then must differ between loaders).
            batch_size: the weight of this value in the epoch mean; inferred from the batch when None.
            metric_attribute: accepted for Lightning code; not needed here (a Metric value is used directly).
            rank_zero_only: the call is made on rank 0 only; such a value cannot use `sync_dist`.

        Raises:
            MisconfigurationError: outside a hook where logging makes sense (e.g. `setup`), with no Trainer, or
                with an option this project does not support (named in the message).
        """
        if self._trainer is None:
            raise MisconfigurationError(
                f"self.log({name!r}) needs an attached Trainer; call it from a hook during fit."
            )
        if not isinstance(name, str) or not name:
            raise MisconfigurationError(f"self.log() needs a non-empty string name, got {name!r}.")
        if enable_graph or sync_dist_group is not None or rank_zero_only or "/dataloader_idx_" in name:
            check_log_options(name, enable_graph, sync_dist, sync_dist_group, add_dataloader_idx, rank_zero_only)
        state = self._trainer.fit_state
        if state.spec.barebones:  # Lightning's rule: a warning, and nothing recorded
            rank_zero_warn(f"self.log({name!r}) under `Trainer(barebones=True)`: logging can impact raw speed, so "
                           "it is disabled in barebones mode; the value is not recorded.")
            return
        state.results.log(
            name, value, on_step, on_epoch, prog_bar, True if logger is None else logger, sync_dist,
            "mean" if reduce_fx == "mean" else reduce_fx_name(reduce_fx), batch_size, add_dataloader_idx,
        )

    def log_dict(
        self,
        dictionary: Mapping[str, Any],
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str | Callable[..., Any] = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """`self.log` for every item of the dict (or a torchmetrics `MetricCollection`), with the same options."""
        for name, value in dictionary.items():
            self.log(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, sync_dist,
                     sync_dist_group, add_dataloader_idx, batch_size, None, rank_zero_only)


    # --- checkpoints -----------------------------------------------------------------------------
    @classmethod
    def load_from_checkpoint(
        cls, checkpoint_path: str | Path, map_location: Any = None, hparams_file: str | Path | None = None,
        strict: bool | None = None, **overrides: Any
    ) -> TrainModule:
        """Rebuild the module from a checkpoint's saved hparams and load its weights (a Lightning 2.x file too).

        Args:
            checkpoint_path: a checkpoint file (path or URL).
            map_location: where to load tensors (default: the CPU).
            hparams_file: a `.yaml` or `.csv` whose values update the saved hparams (Lightning's argument).
            strict: match the weights' keys exactly (None: the new module's `strict_loading`, True by default;
                a value that contradicts a `strict_loading` set in `__init__` is an error, as in Lightning).
            **overrides: `__init__` arguments replacing saved ones; those stored by name only must come here.
        """
        return load_module_from_checkpoint(cls, checkpoint_path, map_location, strict, overrides, hparams_file)
