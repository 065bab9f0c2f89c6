"""More of Lightning's public Trainer attributes: where the run is (`evaluating`, `is_last_batch`, `interrupted`,
`received_sigterm`), what it runs on (`device_ids`, `precision_plugin`, `scaler`, `distributed_sampler_kwargs`),
the checkpoint it loaded (`ckpt_path`), and the ones that name Lightning internals this Trainer does not have
(`fit_loop`, `accelerator`, ...), which refuse with what to read instead.

Kept apart from trainer/properties.py (the flags and the metrics) so each stays short; both read only the Trainer's
public attributes and its `fit_state`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.state import RunningStage, TrainerStatus

if TYPE_CHECKING:
    from trainer.loops.fit_state import FitState


class RefusedAttribute:
    """A Lightning Trainer attribute that exposes an internal object this Trainer does not have: reading it raises
    an AttributeError saying what to read instead (so `getattr(trainer, name, None)` still gives None)."""

    def __init__(self, instead: str) -> None:
        self.instead = instead

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        raise AttributeError(f"'Trainer' object has no attribute {self.name!r}: it is a Lightning internal that "
                             f"this Trainer does not have; {self.instead}.")


class RunProperties:
    """Mixed into Trainer with TrainerProperties."""

    fit_state: FitState
    strategy: Any
    state: Any
    callbacks: list[Any]
    _signals: Any
    _loaded_ckpt_path: str | Path | None
    _user_ckpt_path: str | Path | None

    fit_loop = RefusedAttribute("read trainer.current_epoch, global_step, max_epochs, max_steps, num_training_batches, "
                                "is_last_batch or should_stop")
    validate_loop = RefusedAttribute("read trainer.num_val_batches, val_dataloaders or callback_metrics")
    test_loop = RefusedAttribute("read trainer.num_test_batches, test_dataloaders or callback_metrics")
    accelerator = RefusedAttribute("there are no Accelerator objects: the device is trainer.strategy.root_device "
                                   "(its .type is 'cpu', 'cuda' or 'mps')")

    @property
    def evaluating(self) -> bool:
        """True while a validation (the sanity check included) or a test runs."""
        return self.state.stage in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @property
    def interrupted(self) -> bool:
        """True once the run ended with an exception (or Ctrl-C / a stop signal)."""
        return bool(self.state.status == TrainerStatus.INTERRUPTED)

    @property
    def is_last_batch(self) -> bool:
        """Whether the training batch that runs is the last one of its epoch."""
        return self.fit_state.is_last_batch

    @property
    def received_sigterm(self) -> bool:
        """Whether this process received SIGTERM during the run (it then stops after the batch, with a checkpoint)."""
        import signal

        return bool(self._signals.received == signal.SIGTERM)

    @property
    def enable_validation(self) -> bool:
        """Whether fit validates: a validation source, a `validation_step` and a `limit_val_batches` above 0."""
        return self.fit_state.module is not None and self.fit_state.validation_enabled

    @property
    def val_check_batch(self) -> int | float | None:
        """Training batches between two validations (`inf`: at the epoch's end only); None when they go by time."""
        return self.fit_state.schedule.val_check_batch

    @property
    def device_ids(self) -> list[int]:
        """The indices of this machine's devices the run uses (0 for a CPU)."""
        devices = getattr(self.strategy, "parallel_devices", None) or [self.strategy.root_device]
        return [device.index if device.index is not None else 0 for device in devices]

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any] | None:
        """What a DistributedSampler gets here (`num_replicas`, `rank`), or None with one process."""
        return self.strategy.distributed_sampler_kwargs

    @property
    def precision_plugin(self) -> Any:
        """The run's precision object (a strategies.Precision: autocast, scaler, casting): Lightning's plugin."""
        return self.strategy.precision

    @property
    def scaler(self) -> Any:
        """The GradScaler of `16-mixed`, else None."""
        return getattr(self.strategy.precision, "scaler", None)

    @property
    def early_stopping_callbacks(self) -> list[Any]:
        """Every EarlyStopping callback in use."""
        from trainer.setup.loaded_classes import instances_of

        return instances_of(self.callbacks, "callbacks.early_stopping", "EarlyStopping")

    @property
    def ckpt_path(self) -> str | Path | None:
        """The checkpoint the last fit/validate/test/predict loaded (None: none), or the one set here for the next."""
        return self._user_ckpt_path if self._user_ckpt_path is not None else self._loaded_ckpt_path

    @ckpt_path.setter
    def ckpt_path(self, path: str | Path | None) -> None:
        """Set the checkpoint the next runs load when they are called without `ckpt_path` (as in Lightning; set it
        back to None to stop)."""
        self._user_ckpt_path = path

    def print(self, *args: Any, **kwargs: Any) -> None:
        """`print` on the first process of each machine only."""
        if self.strategy.local_rank == 0:
            print(*args, **kwargs)
