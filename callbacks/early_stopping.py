"""EarlyStopping: stop when a monitored metric stops improving (all ranks agree through the strategy)."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from callbacks.base import Callback
from strategies.comm.distributed import rank_zero_info, rank_zero_warn
from strategies.exceptions import ConfigError, MetricNotFoundError

if TYPE_CHECKING:
    from collections.abc import Callable

    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class EarlyStoppingReason(Enum):
    """Why `EarlyStopping` stopped the run (`EarlyStopping.stopping_reason`), with Lightning 2.6's values."""

    NOT_STOPPED = 0
    STOPPING_THRESHOLD = 1
    DIVERGENCE_THRESHOLD = 2
    PATIENCE_EXHAUSTED = 3
    NON_FINITE_METRIC = 4


class EarlyStopping(Callback):
    """Stop training when `monitor` has not improved by `min_delta` for `patience` checks.

    By default the check runs at the end of each training epoch (after that epoch's validation) when validation runs
    once at the end of every epoch, and after each validation otherwise (`val_check_interval` or
    `check_val_every_n_epoch`): Lightning's rule. The decision is reduced across ranks (any rank may stop the run),
    so every rank stops at the same step.

    Args:
        monitor: the logged metric to watch.
        min_delta: the smallest change that counts as an improvement.
        patience: checks without improvement before stopping.
        verbose: report each improvement and the stop (and, with `strict=False`, a missing metric).
        mode: `"min"` or `"max"`: which direction of `monitor` is better.
        strict: a missing `monitor` key is an error (False: skip the check).
        check_finite: stop when the metric becomes NaN or infinite.
        stopping_threshold: stop as soon as the metric is better than this.
        divergence_threshold: stop as soon as the metric is worse than this.
        check_on_train_epoch_end: check at the end of the training epoch (True) or after validation (False);
            None: Lightning's rule above.
        log_rank_zero_only: with `verbose` under several processes, report from rank 0 only (else every rank
            reports, its message prefixed with its rank).

    Attributes:
        stopped_epoch: the epoch the run stopped in (0 when it did not stop).
        stopping_reason: an `EarlyStoppingReason`; `stopping_reason_message`: the same in words (None until a stop).
        wait_count, best_score: checks since the last improvement, and the best value (a 0-d tensor).

    Raises:
        ConfigError: an invalid `mode` or a negative `patience`.
        MetricNotFoundError: (a RuntimeError) at a check, when `strict` and `monitor` was not logged.
    """

    mode_dict: ClassVar[dict[str, Callable[..., Tensor]]] = {"min": torch.lt, "max": torch.gt}
    """The comparison that means "better" for each `mode` (`monitor_op`)."""
    order_dict: ClassVar[dict[str, str]] = {"min": "<", "max": ">"}
    """The sign shown in the stop messages for each `mode`."""
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
        log_rank_zero_only: bool = False,
    ) -> None:
        if mode not in self.mode_dict:
            raise ConfigError(f"EarlyStopping(mode={mode!r}): `mode` can be min, max, got {mode}.")
        if patience < 0:
            raise ConfigError(f"EarlyStopping(patience={patience}) must be >= 0.")
        self.monitor = monitor
        self.min_delta = min_delta if mode == "max" else -min_delta  # added to the value before comparing
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.log_rank_zero_only = log_rank_zero_only
        self.wait_count = 0
        self.stopped_epoch = 0
        self.stopping_reason = EarlyStoppingReason.NOT_STOPPED
        self.stopping_reason_message: str | None = None
        self.best_score: Tensor = torch.tensor(torch.inf if mode == "min" else -torch.inf)
        self._on_train_epoch_end = check_on_train_epoch_end  # resolved at setup

    @property
    def monitor_op(self) -> Callable[..., Tensor]:
        """`torch.lt` in min mode, `torch.gt` in max mode: `monitor_op(new, old)` is True when `new` is better."""
        return self.mode_dict[self.mode]

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    def state_dict(self) -> dict[str, Any]:
        return {"wait_count": self.wait_count, "stopped_epoch": self.stopped_epoch, "best_score": self.best_score,
                "patience": self.patience, "stopping_reason": self.stopping_reason.value,
                "stopping_reason_message": self.stopping_reason_message}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = state_dict["wait_count"]
        self.stopped_epoch = state_dict["stopped_epoch"]
        self.best_score = torch.as_tensor(state_dict["best_score"])
        self.patience = state_dict.get("patience", self.patience)
        reason = state_dict.get("stopping_reason", EarlyStoppingReason.NOT_STOPPED.value)
        self.stopping_reason = EarlyStoppingReason(reason.value if isinstance(reason, Enum) else reason)
        self.stopping_reason_message = state_dict.get("stopping_reason_message")

    # --- when ----------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if self.check_on_train_epoch_end is None:
            self._on_train_epoch_end = trainer.val_check_interval == 1.0 and trainer.check_val_every_n_epoch == 1
        else:
            self._on_train_epoch_end = self.check_on_train_epoch_end

    def _skips(self, trainer: Trainer) -> bool:
        return trainer.state.fn != "fit" or trainer.sanity_checking or bool(trainer.fast_dev_run)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._on_train_epoch_end and not self._skips(trainer):
            self._run_early_stopping_check(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._on_train_epoch_end and not self._skips(trainer):
            self._run_early_stopping_check(trainer)

    # --- the check -----------------------------------------------------------------------------
    def _run_early_stopping_check(self, trainer: Trainer) -> None:
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            message = (f"Early stopping conditioned on metric `{self.monitor}` which is not available. Log it with "
                       f"self.log, or pass EarlyStopping(monitor=...) one of: {sorted(metrics)} "
                       "(strict=False skips the check instead).")
            if self.strict:
                raise MetricNotFoundError(message)
            if self.verbose:
                rank_zero_warn(message, category=RuntimeWarning)
            return
        current = torch.as_tensor(metrics[self.monitor]).detach().squeeze().cpu()
        should_stop, reason = self._evaluate_stopping_criteria(current)
        should_stop = trainer.strategy.reduce_boolean_decision(should_stop, all=False)
        trainer.should_stop = trainer.should_stop or should_stop
        if should_stop:
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason_message = reason
        if reason and self.verbose:
            self._report(trainer, reason)

    def _evaluate_stopping_criteria(self, current: Tensor) -> tuple[bool, str | None]:
        """(stop?, what to report) for the value `current`; updates the best score, the wait and the reason."""
        better, sign = self.monitor_op, self.order_dict[self.mode]
        if self.check_finite and not torch.isfinite(current):
            self.stopping_reason = EarlyStoppingReason.NON_FINITE_METRIC
            return True, (f"Monitored metric {self.monitor} = {current} is not finite. Previous best value was "
                          f"{self.best_score:.3f}. Signaling Trainer to stop.")
        if self.stopping_threshold is not None and better(current, self.stopping_threshold):
            self.stopping_reason = EarlyStoppingReason.STOPPING_THRESHOLD
            return True, (f"Stopping threshold reached: {self.monitor} = {current} {sign} {self.stopping_threshold}."
                          " Signaling Trainer to stop.")
        if self.divergence_threshold is not None and better(-current, -self.divergence_threshold):
            self.stopping_reason = EarlyStoppingReason.DIVERGENCE_THRESHOLD
            return True, (f"Divergence threshold reached: {self.monitor} = {current} {sign} "
                          f"{self.divergence_threshold}. Signaling Trainer to stop.")
        if better(current - self.min_delta, self.best_score.to(current.device)):
            message = (f"Metric {self.monitor} improved by {abs(self.best_score - current):.3f} >= min_delta = "
                       f"{abs(self.min_delta)}. New best score: {current:.3f}" if torch.isfinite(self.best_score)
                       else f"Metric {self.monitor} improved. New best score: {current:.3f}")
            self.best_score, self.wait_count = current, 0
            return False, message
        self.wait_count += 1
        if self.wait_count < self.patience:
            return False, None
        self.stopping_reason = EarlyStoppingReason.PATIENCE_EXHAUSTED
        return True, (f"Monitored metric {self.monitor} did not improve in the last {self.wait_count} records. "
                      f"Best score: {self.best_score:.3f}. Signaling Trainer to stop.")

    def _report(self, trainer: Trainer, message: str) -> None:
        """Every rank reports (prefixed with its rank) unless `log_rank_zero_only`; one process reports plainly."""
        if trainer.world_size == 1:
            rank_zero_info(message)
        elif not self.log_rank_zero_only or trainer.global_rank == 0:
            print(f"[rank: {trainer.global_rank}] {message}", flush=True)
