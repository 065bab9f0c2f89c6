"""LearningRateMonitor: log each optimizer's learning rate (and optionally momentum, weight decay), named as Lightning
names them."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import ConfigError, MisconfigurationError

if TYPE_CHECKING:
    from torch.optim import Optimizer

    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class LearningRateMonitor(Callback):
    """Logs the learning rate of every optimizer's param groups to the loggers, and puts it in `callback_metrics`
    (so EarlyStopping or ModelCheckpoint can monitor it).

    Names, as in Lightning: `lr-<Optimizer>` (`lr-Adam-1` for the second Adam), or the `name` of the scheduler's
    config (`{"scheduler": ..., "name": "my_lr"}`); with several param groups `/pg1`, `/pg2`, ... or the group's own
    `name` (a single named group: `lr-SGD/<name>`). Momentum and weight decay go under `<name>-momentum` and
    `<name>-weight_decay`.

    Args:
        logging_interval: `"step"` (on the Trainer's `log_every_n_steps` cadence), `"epoch"`, or None: each
            scheduler at its own interval, optimizers without a scheduler at both.
        log_momentum: also log `momentum` (or Adam's `beta1`); 0, with a warning, for optimizers without one.
        log_weight_decay: also log `weight_decay`.

    Attributes:
        lrs: name -> every learning rate logged under it. `last_momentum_values`, `last_weight_decay_values`:
            name-momentum / name-weight_decay -> the latest value.

    Raises:
        ConfigError: an invalid `logging_interval`.
        MisconfigurationError: at fit start, when the Trainer has no logger, or when an optimizer has two param
            groups of the same `name`.
    """

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False,
                 log_weight_decay: bool = False) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise ConfigError(f"LearningRateMonitor(logging_interval={logging_interval!r}): logging_interval should "
                              "be `step` or `epoch` or `None`.")
        self.logging_interval = logging_interval
        self.log_momentum = log_momentum
        self.log_weight_decay = log_weight_decay
        self.lrs: dict[str, list[float]] = {}
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.loggers:
            raise MisconfigurationError("Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger: "
                                        "pass Trainer(logger=True) (or a Logger), or remove the callback.")
        if self.log_momentum and not all("momentum" in o.defaults or "betas" in o.defaults
                                         for o, _, _ in self._monitored(trainer)):
            rank_zero_warn("You have set log_momentum=True, but some optimizers do not have momentum. This will log "
                           "a value 0 for the momentum.", category=RuntimeWarning)
        names = [name for _, group_names, _ in self._monitored(trainer) for name in group_names]
        self.lrs = {name: [] for name in names}
        self.last_momentum_values = {f"{name}-momentum": None for name in names}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in names}

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        if self.logging_interval != "epoch" and trainer.metrics_router.batch_starting_logs:
            self._log(trainer, "step" if self.logging_interval is None else None)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.logging_interval != "step":
            self._log(trainer, "epoch" if self.logging_interval is None else None)

    # --- names -----------------------------------------------------------------------------------------------------
    def _monitored(self, trainer: Trainer) -> list[tuple[Optimizer, list[str], str | None]]:
        """(optimizer, a name per param group, its scheduler's interval or None) for the optimizers with a scheduler,
        then those without one, in Lightning's order and naming."""
        seen: list[Any] = []
        types: Counter[type] = Counter()
        found: list[tuple[Optimizer, list[str], str | None]] = []
        for config in trainer.lr_scheduler_configs:
            optimizer = config.scheduler.optimizer
            found.append((optimizer, self._group_names(optimizer, config.name, seen, types), config.interval))
        for optimizer in trainer.optimizers:
            optimizer = getattr(optimizer, "optimizer", optimizer)  # a wrapper (ZeRO) holds the real one
            if not any(optimizer is other for other in seen):
                found.append((optimizer, self._group_names(optimizer, None, seen, types), None))
        return found

    @staticmethod
    def _group_names(optimizer: Optimizer, name: str | None, seen: list[Any], types: Counter[type]) -> list[str]:
        seen.append(optimizer)
        groups = optimizer.param_groups
        labels = [group.get("name", f"pg{i}") for i, group in enumerate(groups, start=1)]
        repeated = sorted({label for label in labels if labels.count(label) > 1})
        if name is None:
            types[type(optimizer)] += 1
            count = types[type(optimizer)]
            name = f"lr-{type(optimizer).__name__}" + (f"-{count - 1}" if count > 1 else "")
        if repeated:
            raise MisconfigurationError(f"A single `Optimizer` cannot have multiple parameter groups with identical "
                                        f"`name` values: {name} has duplicated parameter group names {repeated}. "
                                        "Give each param group its own name.")
        if len(groups) > 1:
            return [f"{name}/{label}" for label in labels]
        return [f"{name}/{groups[0]['name']}" if groups[0].get("name") else name]

    # --- values ----------------------------------------------------------------------------------------------------
    def _log(self, trainer: Trainer, interval: str | None) -> None:
        """Log the schedulers due at `interval` (None: all) and every optimizer without a scheduler."""
        stats: dict[str, float] = {}
        for optimizer, names, scheduled in self._monitored(trainer):
            for name in names:  # a group was added (BaseFinetuning): `lr-SGD`'s history continues as `lr-SGD/pg1`
                if name.endswith("/pg1") and name[:-4] in self.lrs:
                    self.lrs[name] = self.lrs.pop(name[:-4])
            if scheduled is None or interval is None or scheduled == interval:
                stats.update(self._stats(optimizer, names))
        if not stats:
            return
        device = trainer.strategy.root_device
        trainer.metrics_router.add_callback_metrics({k: torch.tensor(v, device=device) for k, v in stats.items()})
        trainer.metrics_router.send_measured(stats, step=trainer.global_step)

    def _stats(self, optimizer: Optimizer, names: list[str]) -> dict[str, float]:
        stats: dict[str, float] = {}
        betas = "betas" in optimizer.defaults
        for group, name in zip(optimizer.param_groups, names, strict=True):
            lr = float(group["lr"])
            self.lrs.setdefault(name, []).append(lr)
            stats[name] = lr
            if self.log_momentum:
                momentum = float(group["betas"][0] if betas else group.get("momentum", 0))
                self.last_momentum_values[f"{name}-momentum"] = momentum
                stats[f"{name}-momentum"] = momentum
            if self.log_weight_decay:
                decay = float(group["weight_decay"])
                self.last_weight_decay_values[f"{name}-weight_decay"] = decay
                stats[f"{name}-weight_decay"] = decay
        return stats
