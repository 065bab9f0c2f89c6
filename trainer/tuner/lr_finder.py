"""The learning-rate range test behind `Tuner.lr_find`: train `num_training` optimizer steps while the learning rate
rises from `min_lr` to `max_lr`, record the smoothed loss at each, and suggest the rate where it falls fastest.

The schedule, the smoothing (an exponential moving average with bias correction, beta 0.98), the early stop (loss
above `early_stop_threshold` times the best seen) and the suggestion (steepest negative gradient of loss against
learning rate, skipping the first 10 and the last point) are Lightning 2.6's, so a port gets the same curve and the
same suggestion (tested against Lightning). The sweep sets the rate on the optimizer before every optimizer step
instead of through a scheduler; the user's own schedulers are left out of the sweep, as in Lightning.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from strategies.exceptions import ConfigError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)
MODES = ("exponential", "linear")


def sweep_lr(step: int, min_lr: float, max_lr: float, num_training: int, mode: str) -> float:
    """The rate for optimizer step `step` (0-based). Lightning's schedulers start at `min_lr` and then jump to
    fraction (step + 1) / num_training of the way: their first step() call happens in their constructor."""
    if step == 0:
        return min_lr
    fraction = (step + 1) / num_training
    if mode == "linear":
        return min_lr + fraction * (max_lr - min_lr)
    return min_lr * (max_lr / min_lr) ** fraction


class LRFinderResult:
    """What `Tuner.lr_find` returns: `results` ({"lr": [...], "loss": [...]}), `suggestion()` and `plot()`."""

    def __init__(self, mode: str, min_lr: float, max_lr: float, num_training: int) -> None:
        self.mode = mode
        self.lr_min, self.lr_max, self.num_training = min_lr, max_lr, num_training
        self.results: dict[str, list[float]] = {"lr": [], "loss": []}
        self.plot_path: Path | None = None  # where Tuner.lr_find saved the plot, on global rank 0
        self._optimal_idx: int | None = None

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The rate at the steepest descent of the loss, or None (with an error logged) when fewer than two finite
        points remain after skipping `skip_begin` and `skip_end`."""
        losses = torch.tensor(self.results["loss"][skip_begin:-skip_end], dtype=torch.float64)
        lrs = torch.tensor(self.results["lr"][skip_begin:-skip_end], dtype=torch.float64)
        finite = torch.isfinite(losses)
        losses, lrs = losses[finite], lrs[finite]
        if len(losses) < 2:
            log.error("lr_find: too few loss points for a suggestion; raise num_training or use more data.")
            self._optimal_idx = None
            return None
        steepest = int(torch.argmin(torch.gradient(losses, spacing=[lrs])[0]))
        kept = torch.arange(len(self.results["loss"]))[skip_begin:-skip_end][finite]
        self._optimal_idx = int(kept[steepest])
        return self.results["lr"][self._optimal_idx]

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """Loss against learning rate (log scale in exponential mode), the suggestion marked when `suggest`;
        returns the matplotlib figure."""
        if ax is None:
            import matplotlib.pyplot as plt  # imported only here: matplotlib is heavy

            fig, ax = plt.subplots()
        else:
            fig = ax.figure
        lrs, losses = self.results["lr"], self.results["loss"]
        ax.plot(lrs, losses)
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest and self.suggestion() is not None and self._optimal_idx is not None:
            ax.plot(lrs[self._optimal_idx], losses[self._optimal_idx], markersize=10, marker="o", color="red")
        if show:
            import matplotlib.pyplot as plt

            plt.show()
        return fig


class LRSweep(Callback):
    """Runs in the tuner's trial Trainer: sets the swept rate before each optimizer step, records the smoothed
    loss after it, and stops the trial when the loss diverges."""

    def __init__(self, result: LRFinderResult, early_stop_threshold: float | None, beta: float = 0.98) -> None:
        self.result = result
        self.early_stop_threshold = early_stop_threshold
        self.beta = beta
        self._average = 0.0
        self._best = 0.0
        # windows swept so far: Lightning's global step, which also counts a window whose training_step returned
        # None (this Trainer's does not), so that such windows advance the sweep and the trial ends after
        # num_training of them
        self._windows = 0

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if len(trainer.optimizers) != 1:
            raise ConfigError(f"lr_find needs configure_optimizers() to return one optimizer; it returned "
                              f"{len(trainer.optimizers)}.")
        if any(hasattr(p, "placements") for p in pl_module.parameters()):
            raise ConfigError("lr_find cannot run under zero2/zero3, which shard the module in place; run it with "
                              "strategy='ddp' (or on one device), then fit with the sharded strategy.")
        trainer.lr_scheduler_configs.clear()  # the sweep owns the rate, as in Lightning

    def _window_ends(self, trainer: Trainer, batch_idx: int) -> bool:
        return (batch_idx + 1) % trainer.accumulate_grad_batches == 0

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        r = self.result
        lr = sweep_lr(self._windows, r.lr_min, r.lr_max, r.num_training, r.mode)
        for group in trainer.optimizers[0].param_groups:
            group["lr"] = lr
        if self._window_ends(trainer, batch_idx):
            r.results["lr"].append(lr)

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._window_ends(trainer, batch_idx):
            return
        self._windows = step = self._windows + 1
        if step >= self.result.num_training:
            trainer.should_stop = True
        loss = outputs if isinstance(outputs, torch.Tensor) else (outputs or {}).get("loss")
        if loss is None:
            self.result.results["loss"].append(math.nan)
            return
        self._average = self.beta * self._average + (1 - self.beta) * float(loss)
        smoothed = self._average / (1 - self.beta ** (step + 1))
        if self.early_stop_threshold is not None and step > 1 and smoothed > self.early_stop_threshold * self._best:
            trainer.should_stop = True  # agreed across ranks by the loop
        if smoothed < self._best or step == 1:
            self._best = smoothed
        self.result.results["loss"].append(smoothed)

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        # every rank returns rank 0's curve, as Lightning's does (ranks saw different batches)
        self.result.results = trainer.strategy.broadcast(self.result.results)
