"""Callback: every hook as a typed no-op with Lightning 2.x's signature `(trainer, module, ...)`.

Hooks run on every rank. A callback gates only its I/O on `trainer.is_global_zero`, never a
collective (a collective on one rank only would hang the others).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor
from torch.optim import Optimizer

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class Callback:
    """Override the hooks you need. `state_dict`/`load_state_dict` put state into checkpoints.

    Every hook receives the Trainer and the TrainModule first (Lightning's `(trainer, pl_module, ...)`),
    then the same arguments as the TrainModule hook of the same name. Callbacks run before the module's
    hook, in list order, with ModelCheckpoint last.

    Example:
        ```python
        class PrintLoss(Callback):
            def on_train_epoch_end(self, trainer, pl_module):
                if trainer.is_global_zero:  # gate I/O only, never a collective
                    print(trainer.current_epoch, float(trainer.callback_metrics["train_loss"]))
        ```
    """

    @property
    def state_key(self) -> str:
        """Key of this callback's state in a checkpoint; include constructor arguments to allow duplicates (see
        `_generate_state_key`). Two callbacks with a state (`state_dict` overridden) may not share one."""
        return type(self).__qualname__

    def _generate_state_key(self, **kwargs: Any) -> str:
        """A `state_key` made of the class name and the arguments that tell instances apart, written as Lightning
        writes it (`"EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}"`), so a checkpoint's `callbacks` keys are
        the same under both. Lightning documents this helper for user callbacks that can appear more than once:
        `return self._generate_state_key(what=self.what)`."""
        return f"{type(self).__qualname__}{kwargs!r}"

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints under `state_key` (tensors and primitives only); `{}` saves nothing."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what state_dict returned."""

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Called on every rank at the start of fit, validate, test and predict.

        It runs after the datamodule's `setup` and before the module moves to its device.
        `stage` (passed by keyword, as Lightning does) is the `TrainerFn` of the run, a str enum equal to 'fit',
        'validate', 'test' or 'predict'.
        """

    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        """Called on every rank at the end of every run, also after an exception; `stage` as in `setup`."""

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called once per fit, after `configure_optimizers` and any checkpoint restore."""

    def on_fit_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called once when fit finished without an exception."""

    def on_sanity_check_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called before the validation batches that run ahead of training (`num_sanity_val_steps`)."""

    def on_sanity_check_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called after the sanity-check validation, whose results are discarded."""

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called after the sanity check, before the first training epoch."""

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called after the last training epoch."""

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called at the start of every training epoch."""

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called at the end of every training epoch, after its validation.

        ModelCheckpoint and EarlyStopping run after this hook, so they can monitor what it logs.
        """

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        """Called before `training_step`; return -1 to end the current epoch here."""

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Called after `training_step`, and after the optimizer step when one was due.

        `outputs` is what `training_step` returned, as a dict with the loss detached.
        """

    def on_before_backward(self, trainer: Trainer, pl_module: TrainModule, loss: Tensor) -> None:
        """Called with the loss just before backward (not yet divided by `accumulate_grad_batches`)."""

    def on_after_backward(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called after backward; `.grad` holds the gradients (under 16-mixed, still scaled)."""

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: TrainModule, optimizer: Optimizer) -> None:
        """Called before each optimizer step, after its closure (training_step and backward) ran.

        In automatic optimization the gradients are unscaled by then, and not yet clipped.
        """

    def on_before_zero_grad(self, trainer: Trainer, pl_module: TrainModule, optimizer: Optimizer) -> None:
        """Called just before the gradients are zeroed: after training_step and before backward, on the first batch of
        each accumulation window (as in Lightning)."""

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called at the start of every validation run, the sanity check included."""

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called at the end of every validation run."""

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called before the first validation batch."""

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called after the last validation batch; epoch values are already reduced."""

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before `validation_step`."""

    def on_validation_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Called after `validation_step` with what it returned."""

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called at the start of `trainer.test()`."""

    def on_test_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called at the end of `trainer.test()`."""

    def on_test_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called before the first test batch."""

    def on_test_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called after the last test batch; epoch values are already reduced."""

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before `test_step`."""

    def on_test_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Called after `test_step` with what it returned."""

    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called at the start of `trainer.predict()`."""

    def on_predict_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called at the end of `trainer.predict()`."""

    def on_predict_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called before the first predict batch."""

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Called after the last predict batch."""

    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Called before `predict_step`."""

    def on_predict_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Called after `predict_step` with what it returned."""

    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        """Called on every rank when the run raises, before teardown; the exception then propagates."""

    def on_save_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """Called on every rank while a checkpoint is built; add your own entries to `checkpoint`.

        Store tensors and primitives only: checkpoints are loaded with `weights_only=True`.
        """

    def on_load_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """Called with a loaded checkpoint, after the weights were restored.

        Read back what `on_save_checkpoint` added.
        """


class Checkpoint(Callback):
    """The base of the callbacks that save checkpoints (ModelCheckpoint, OnExceptionCheckpoint; Lightning's
    `Checkpoint`): the Trainer runs them after every other callback, so the states they save are final."""
