"""ProgressBarBase: what every progress bar shares, whatever draws it (tqdm in ProgressBar, rich in RichProgressBar).

It owns Lightning's rules: which bars exist (a training bar per epoch; a sanity-check, validation, test or predict bar
per dataloader), their descriptions and totals, the metrics they show (`v_num` and the `prog_bar=True` values), that
only global rank 0 draws, and when bars open, advance and close. A subclass draws: it implements `_open`, `_advance`,
`_show_metrics`, `_close` and `_stop`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from strategies.comm.distributed import rank_zero_warn

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer

TRAIN, EVAL = "train", "eval"  # the two bars: training, and the evaluation running now (sanity, val, test, predict)


class ProgressBarBase(Callback):
    """The base of progress bars (Lightning's abstract `ProgressBar`): subclass it to draw bars your own way.

    Only one progress bar callback may be given to a Trainer; when one is given, the Trainer adds no default bar.
    """

    sanity_check_description = "Sanity Checking"
    train_description = "Training"
    validation_description = "Validation"
    test_description = "Testing"
    predict_description = "Predicting"

    def __init__(self) -> None:
        self._trainer: Trainer | None = None
        self._enabled = True
        self._loader: int | None = None  # the evaluation dataloader whose bar is open

    # --- state -----------------------------------------------------------------------------------------------
    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise TypeError(f"{type(self).__name__}.trainer is not set before the Trainer's `setup`.")
        return self._trainer

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    @property
    def is_disabled(self) -> bool:
        return not self.is_enabled

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print without breaking the bars (what `TrainModule.print` calls)."""
        print(*args, **kwargs)

    # --- Lightning's totals ------------------------------------------------------------------------------------
    @property
    def total_train_batches(self) -> int | float:
        """Batches of this training epoch (`inf` for a loader without length); with `max_epochs=-1` and
        `max_steps`, no more than the steps left."""
        trainer = self.trainer
        if trainer.max_epochs == -1 and trainer.max_steps is not None and trainer.max_steps > 0:
            return min(trainer.num_training_batches, trainer.max_steps - trainer.global_step)
        return trainer.num_training_batches

    def _current(self, batches: list[int | float]) -> int | float:
        return batches[self._loader or 0] if batches else 0

    @property
    def total_val_batches_current_dataloader(self) -> int | float:
        trainer = self.trainer
        return self._current(trainer.num_sanity_val_batches if trainer.sanity_checking else trainer.num_val_batches)

    @property
    def total_val_batches(self) -> int | float:
        """Validation batches of this epoch over every val loader: 0 in an epoch without validation
        (`check_val_every_n_epoch`); may be `inf`."""
        trainer = self.trainer
        every = trainer.check_val_every_n_epoch
        if every is not None and (trainer.current_epoch + 1) % every != 0:
            return 0
        return sum(trainer.num_val_batches)

    def has_dataloader_changed(self, dataloader_idx: int) -> bool:
        """Record `dataloader_idx` as the evaluation loader now shown; True when it differs from the previous one."""
        changed = self._loader != dataloader_idx
        self._loader = dataloader_idx
        return changed

    def reset_dataloader_idx_tracker(self) -> None:
        """Forget the evaluation loader shown (the next batch opens a new bar)."""
        self._loader = None

    @property
    def total_test_batches_current_dataloader(self) -> int | float:
        return self._current(self.trainer.num_test_batches)

    @property
    def total_predict_batches_current_dataloader(self) -> int | float:
        return self._current(self.trainer.num_predict_batches)

    def get_metrics(self, trainer: Trainer, pl_module: TrainModule) -> dict[str, Any]:
        """What the bar shows: the logger's version as `v_num` (its last 4 characters for a string), then the
        values logged with `prog_bar=True`. Override it to change what is shown."""
        standard: dict[str, Any] = {}
        if trainer.loggers:
            versions = [logger.version for logger in trainer.loggers]
            version = versions[0] if len(versions) == 1 else "_".join(dict.fromkeys(map(str, versions)))
            if version not in ("", None):
                standard["v_num"] = version[-4:] if isinstance(version, str) else version
        shown = trainer.progress_bar_metrics
        duplicates = sorted(standard.keys() & shown.keys())
        if duplicates:
            rank_zero_warn(f"The progress bar already shows {', '.join(duplicates)}; "
                           f"`self.log('{duplicates[0]}', ..., prog_bar=True)` replaces it there.")
        return {**standard, **shown}

    def train_epoch_description(self, epoch: int) -> str:
        """The training bar's description (Lightning's tqdm bar: "Epoch N")."""
        return f"Epoch {epoch}"

    # --- what a subclass draws ---------------------------------------------------------------------------------
    def _open(self, role: str, description: str, total: int | float) -> None:
        """Show a bar for `role` (TRAIN or EVAL) at 0 of `total` (`inf`: unknown), replacing the previous one."""
        raise NotImplementedError

    def _advance(self, role: str, completed: int) -> bool:
        """Move the bar to `completed`; True when it redraws now (then the training bar gets fresh metrics)."""
        raise NotImplementedError

    def _show_metrics(self, metrics: dict[str, Any]) -> None:
        """Show `metrics` beside the training bar."""
        raise NotImplementedError

    def _close(self, role: str, hide: bool) -> None:
        """The bar of `role` is done; `hide` (evaluation inside fit) lets a display remove it."""
        raise NotImplementedError

    def _stop(self) -> None:
        """Close every bar (end of a run, or an exception)."""
        raise NotImplementedError

    # --- when bars open, advance and close -----------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()

    def _refresh_metrics(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.is_enabled:
            self._show_metrics(self.get_metrics(trainer, pl_module))

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.is_enabled:
            self._open(TRAIN, self.train_epoch_description(trainer.current_epoch), self.total_train_batches)

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.is_enabled and self._advance(TRAIN, batch_idx + 1):
            self._refresh_metrics(trainer, pl_module)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._refresh_metrics(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.is_enabled:
            self._close(TRAIN, hide=False)

    def _eval_batch_start(self, description: str, dataloader_idx: int, total: Any) -> None:
        if self.is_disabled or self._loader == dataloader_idx:
            return
        self._loader = dataloader_idx
        self._open(EVAL, description, total())

    def _eval_end(self, hide: bool) -> None:
        if self.is_enabled and self._loader is not None:
            self._close(EVAL, hide)
        self._loader = None

    def on_validation_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        description = self.sanity_check_description if trainer.sanity_checking else self.validation_description
        self._eval_batch_start(description, dataloader_idx, lambda: self.total_val_batches_current_dataloader)

    def on_validation_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.is_enabled:
            self._advance(EVAL, batch_idx + 1)

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        fitting = trainer.state.fn == "fit"
        self._eval_end(hide=fitting)
        if fitting and not trainer.sanity_checking:
            self._refresh_metrics(trainer, pl_module)

    def on_test_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._eval_batch_start(self.test_description, dataloader_idx,
                               lambda: self.total_test_batches_current_dataloader)

    def on_test_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.is_enabled:
            self._advance(EVAL, batch_idx + 1)

    def on_test_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_end(hide=False)

    def on_predict_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        self._eval_batch_start(self.predict_description, dataloader_idx,
                               lambda: self.total_predict_batches_current_dataloader)

    def on_predict_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.is_enabled:
            self._advance(EVAL, batch_idx + 1)

    def on_predict_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_end(hide=False)

    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self._loader = None
        self._stop()

    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        self._loader = None
        self._stop()
