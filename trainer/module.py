"""TrainModule: the user's model, step hooks and optimizer factory (a LightningModule counterpart)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from strategies.base import _StrategyOptimizer
from strategies.exceptions import MisconfigurationError

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class AttributeDict(dict):
    """A dict whose keys are also attributes: `self.hparams.lr`."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"hparams has no key {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


def _default_hook(fn: Any) -> Any:
    """Mark a base-class data hook so the Trainer can tell that the user did not define it."""
    fn._is_default_hook = True
    return fn


class DataHooks:
    """The optional `*_dataloader()` hooks shared by TrainModule and DataModule; marked so the Trainer can
    tell a hook the user defined from this default."""

    @_default_hook
    def train_dataloader(self) -> Any:
        return None

    @_default_hook
    def val_dataloader(self) -> Any:
        return None

    @_default_hook
    def test_dataloader(self) -> Any:
        return None

    @_default_hook
    def predict_dataloader(self) -> Any:
        return None


class TrainModule(DataHooks, nn.Module):
    """Subclass this: define `training_step` and `configure_optimizers`, optionally the other hooks.

    Every hook below is a no-op here; the Trainer calls them in the order documented in trainer.hooks.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Trainer | None = None
        self._hparams: AttributeDict = AttributeDict()
        self._hparams_to_log = True
        self.automatic_optimization: bool = True

    # --- properties --------------------------------------------------------------------------
    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer; call it from inside fit/validate.")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        self._trainer = trainer

    @property
    def device(self) -> torch.device:
        for tensor in self.parameters():
            return tensor.device
        for tensor in self.buffers():
            return tensor.device
        return torch.device("cpu")

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def hparams(self) -> AttributeDict:
        return self._hparams

    # --- steps (override) --------------------------------------------------------------------
    def training_step(self, *args: Any, **kwargs: Any) -> Tensor | Mapping[str, Any] | None:
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
        raise MisconfigurationError(
            f"{type(self).__name__} does not define configure_optimizers(); it must return an optimizer "
            "(or a list, a tuple (optimizers, schedulers), or a dict with 'optimizer' and 'lr_scheduler')."
        )

    # --- lifecycle hooks (no-ops) --------------------------------------------------------------
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_before_backward(self, loss: Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None: ...
    def on_before_zero_grad(self, optimizer: Optimizer) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...

    # --- logging -----------------------------------------------------------------------------
    def log(
        self,
        name: str,
        value: Any,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        logger: bool = True,
        sync_dist: bool = False,
        reduce_fx: str = "mean",
        batch_size: int | None = None,
    ) -> None:
        """Record a metric. Defaults follow Lightning: per step in training, per epoch in evaluation."""
        if self._trainer is None:
            raise MisconfigurationError(
                f"self.log({name!r}) needs an attached Trainer; call it from a hook during fit."
            )
        if not isinstance(name, str) or not name:
            raise MisconfigurationError(f"self.log() needs a non-empty string name, got {name!r}.")
        self._trainer._results.log(name, value, on_step, on_epoch, prog_bar, logger, sync_dist, reduce_fx, batch_size)

    def log_dict(self, dictionary: Mapping[str, Any], **kwargs: Any) -> None:
        """`self.log` for every item of the dict, with the same options."""
        for name, value in dictionary.items():
            self.log(name, value, **kwargs)

    # --- hyperparameters -------------------------------------------------------------------------
    def save_hyperparameters(self, *args: Any, ignore: Sequence[str] | str | None = None, logger: bool = True) -> None:
        """Record `__init__` arguments (all, or the names given, or a dict) into `self.hparams`."""
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        if len(args) == 1 and isinstance(args[0], Mapping):
            values = dict(args[0])
        else:
            values = self._init_arguments()
            if args:
                missing = [a for a in args if a not in values]
                if missing:
                    raise MisconfigurationError(f"save_hyperparameters{args}: {missing} are not __init__ arguments.")
                values = {k: values[k] for k in args}
        self._hparams.update({k: v for k, v in values.items() if k not in ignored})
        self._hparams_to_log = logger

    def _init_arguments(self) -> dict[str, Any]:
        """Find the frame of this object's __init__ and read its arguments from there."""
        frame = inspect.currentframe()
        values: dict[str, Any] = {}
        while frame is not None:
            if frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is self:
                info = inspect.getargvalues(frame)
                for arg in info.args[1:]:
                    values.setdefault(arg, info.locals[arg])
                if info.keywords and isinstance(info.locals.get(info.keywords), dict):
                    for k, v in info.locals[info.keywords].items():
                        values.setdefault(k, v)
            frame = frame.f_back
        return values

    # --- optimization --------------------------------------------------------------------------
    def optimizers(self) -> Any:
        """The optimizer(s) the Trainer set up: one object, or a list when there are several."""
        opts = self.trainer._optimizers_for_user()
        return opts[0] if len(opts) == 1 else opts

    def lr_schedulers(self) -> Any:
        """The scheduler(s) from configure_optimizers: None, one object, or a list."""
        scheds = [c.scheduler for c in self.trainer.lr_scheduler_configs]
        if not scheds:
            return None
        return scheds[0] if len(scheds) == 1 else scheds

    def manual_backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward for manual optimization: use this instead of `loss.backward()` (precision, DDP)."""
        from trainer.hooks import call_hook

        trainer = self.trainer
        call_hook(trainer, "on_before_backward", loss)
        trainer.strategy.backward(loss)
        call_hook(trainer, "on_after_backward")

    def clip_gradients(
        self, optimizer: Optimizer | _StrategyOptimizer, gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
    ) -> None:
        """Clip gradients in manual optimization through the strategy (unscales under AMP)."""
        if gradient_clip_algorithm == "norm":
            self.trainer.strategy.clip_gradients(optimizer, max_norm=gradient_clip_val)
        else:
            self.trainer.strategy.clip_gradients(optimizer, max_value=gradient_clip_val)

    # --- checkpoints -----------------------------------------------------------------------------
    @classmethod
    def load_from_checkpoint(
        cls, checkpoint_path: str | Path, map_location: Any = None, strict: bool = True, **overrides: Any
    ) -> TrainModule:
        """Rebuild the module from a checkpoint's saved hparams (plus overrides) and load its weights."""
        from trainer.checkpoint import load_module_from_checkpoint

        return load_module_from_checkpoint(cls, checkpoint_path, map_location, strict, overrides)
