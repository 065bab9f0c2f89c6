"""LearningRateMonitor: log each optimizer's learning rate (and optionally momentum, weight decay)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from strategies.exceptions import ConfigError, MisconfigurationError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class LearningRateMonitor(Callback):
    """Logs `lr-<Optimizer>` (with `/pg<i>` per param group when there are several) to the loggers.

    `logging_interval`: "step", "epoch", or None (each scheduler's own interval; "epoch" without schedulers).

    Args:
        logging_interval: `"step"` (on the Trainer's `log_every_n_steps` cadence), `"epoch"`, or None.
        log_momentum: also log `momentum` (or Adam's `beta1`).
        log_weight_decay: also log `weight_decay`.

    Raises:
        ConfigError: an invalid `logging_interval`.
        MisconfigurationError: at fit start, when the Trainer has no logger.
    """

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False,
                 log_weight_decay: bool = False) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise ConfigError(
                f"LearningRateMonitor(logging_interval={logging_interval!r}): use None, 'step' or 'epoch'."
            )
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.lrs: dict[str, list[float]] = {}

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.loggers:
            raise MisconfigurationError("LearningRateMonitor needs a logger; remove it or pass Trainer(logger=True).")

    def _interval(self, trainer: Trainer) -> str:
        if self.logging_interval is not None:
            return self.logging_interval
        intervals = {c.interval for c in trainer.lr_scheduler_configs}
        return "step" if intervals == {"step"} else "epoch"

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        if self._interval(trainer) == "step" and trainer.metrics_router.batch_starting_logs:
            self._log(trainer)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._interval(trainer) == "epoch":
            self._log(trainer)

    def _log(self, trainer: Trainer) -> None:
        values: dict[str, float] = {}
        names: dict[str, int] = {}
        for opt in trainer.optimizers:
            base = f"lr-{type(opt).__name__}"
            names[base] = names.get(base, -1) + 1
            name = base if names[base] == 0 else f"{base}-{names[base]}"
            groups = opt.param_groups
            for i, group in enumerate(groups):
                key = name if len(groups) == 1 else f"{name}/pg{i + 1}"
                values[key] = float(group["lr"])
                if self.log_momentum:
                    momentum = group.get("momentum", group.get("betas", (0.0,))[0])
                    values[key.replace("lr-", "lr-momentum-", 1)] = float(momentum)
                if self.log_weight_decay and "weight_decay" in group:
                    values[key.replace("lr-", "lr-weight_decay-", 1)] = float(group["weight_decay"])
        for key, value in values.items():
            self.lrs.setdefault(key, []).append(value)
        trainer.metrics_router.send_measured(values, step=trainer.global_step)
