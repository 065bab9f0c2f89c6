"""EarlyStopping: stop when a monitored metric stops improving (all ranks agree through the strategy)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from strategies.comm.distributed import rank_zero_info
from strategies.exceptions import ConfigError, MisconfigurationError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class EarlyStopping(Callback):
    """Stop training when `monitor` has not improved by `min_delta` for `patience` checks.

    Checks run after validation, or at the end of each training epoch when there is no validation
    (or when `check_on_train_epoch_end=True`). The decision is reduced across ranks (any rank may
    stop the run), so every rank stops at the same step.

    Args:
        monitor: the logged metric to watch.
        min_delta: the smallest change that counts as an improvement.
        patience: checks without improvement before stopping.
        verbose: report each improvement and the stop on rank 0.
        mode: `"min"` or `"max"`: which direction of `monitor` is better.
        strict: a missing `monitor` key is an error (False: skip the check).
        check_finite: stop when the metric becomes NaN or infinite.
        stopping_threshold: stop as soon as the metric is better than this.
        divergence_threshold: stop as soon as the metric is worse than this.
        check_on_train_epoch_end: check at the end of the training epoch instead of after validation.

    Raises:
        ConfigError: an invalid `mode` or a negative `patience`.
    """

    is_monitoring_callback = True

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ConfigError(f"EarlyStopping(mode={mode!r}) is not valid: use 'min' or 'max'.")
        if patience < 0:
            raise ConfigError(f"EarlyStopping(patience={patience}) must be >= 0.")
        self.monitor = monitor
        self.min_delta = abs(min_delta) if mode == "max" else -abs(min_delta)
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.wait_count = 0
        self.stopped_epoch = 0
        self.best_score = math.inf if mode == "min" else -math.inf
        self.stopping_reason: str | None = None

    @property
    def state_key(self) -> str:
        return f"EarlyStopping{{monitor={self.monitor!r}, mode={self.mode!r}}}"

    def state_dict(self) -> dict[str, Any]:
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch, "best_score": self.best_score,
                "patience": self.patience}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = state_dict["wait_count"]
        self.stopped_epoch = state_dict["stopped_epoch"]
        self.best_score = state_dict["best_score"]

    def _on_train_epoch_end_enabled(self, trainer: Trainer) -> bool:
        """Lightning's rule: check at the training epoch's end (after the module's `on_train_epoch_end`, so a metric
        it logs can be monitored) when the epoch validates once at its end; after each validation otherwise."""
        if self.check_on_train_epoch_end is not None:
            return self.check_on_train_epoch_end
        return trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1

    @staticmethod
    def _skips_check(trainer: Trainer) -> bool:
        return trainer.state.fn is None or trainer.state.fn.value != "fit" or trainer.sanity_checking

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._on_train_epoch_end_enabled(trainer) and not self._skips_check(trainer):
            self._check(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._on_train_epoch_end_enabled(trainer) and not self._skips_check(trainer):
            self._check(trainer)

    def _evaluate(self, current: float) -> tuple[bool, str | None]:
        if self.check_finite and not math.isfinite(current):
            return True, f"Monitored metric {self.monitor} = {current} is not finite."
        better = (lambda a, b: a < b) if self.mode == "min" else (lambda a, b: a > b)
        if self.stopping_threshold is not None and better(current, self.stopping_threshold):
            return True, f"Stopping threshold reached: {self.monitor} = {current} beats {self.stopping_threshold}."
        if self.divergence_threshold is not None and better(self.divergence_threshold, current):
            return True, f"Divergence threshold: {self.monitor} = {current} is worse than {self.divergence_threshold}."
        if better(current - self.min_delta, self.best_score):
            self.best_score, self.wait_count = current, 0
            return False, None
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return True, (f"Monitored metric {self.monitor} did not improve in the last {self.wait_count} checks. "
                          f"Best score: {self.best_score:.6g}.")
        return False, None

    def _check(self, trainer: Trainer) -> None:
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            if self.strict:
                raise MisconfigurationError(
                    f"EarlyStopping(monitor={self.monitor!r}) found no such metric. Logged metrics: "
                    f"{sorted(metrics)}. Log it with self.log, fix monitor, or pass strict=False."
                )
            return
        stop, reason = self._evaluate(float(metrics[self.monitor]))
        stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        if stop:
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason = reason
            if self.verbose and reason:
                rank_zero_info(reason)
