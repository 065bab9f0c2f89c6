"""Type names for the hooks' signatures, under Lightning's names (`lightning.pytorch.utilities.types`), so that a
ported module keeps its annotations: what a step returns, what the `*_dataloader` hooks return, and the forms of
`configure_optimizers`' return that trainer/core/optimizer_setup.py accepts.

Example:
    ```python
    from trainer import STEP_OUTPUT, OptimizerLRScheduler

    class Net(TrainModule):
        def training_step(self, batch, batch_idx) -> STEP_OUTPUT: ...
        def configure_optimizers(self) -> OptimizerLRScheduler: ...
    ```
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from typing_extensions import NotRequired, Required, TypedDict

from strategies.model.wrapped_optimizer import StrategyOptimizer

# What a training/validation/test step may return: a loss tensor, a dict holding "loss" (and anything else), or None.
STEP_OUTPUT = Tensor | Mapping[str, Any] | None
# What `train_dataloader()` / `val_dataloader()` (and test, predict) may return: any iterable or collection of them.
TRAIN_DATALOADERS = Any
EVAL_DATALOADERS = Any

LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)  # for isinstance checks
LRSchedulerTypeUnion = LRScheduler | ReduceLROnPlateau
LRSchedulerPLType = LRSchedulerTypeUnion
LRSchedulerType = type[LRScheduler] | type[ReduceLROnPlateau]

# `self.optimizers()`: the wrapped optimizer, or a list of them with several.
MODULE_OPTIMIZERS = Optimizer | StrategyOptimizer | list[Optimizer] | list[StrategyOptimizer]


class LRSchedulerConfigType(TypedDict, total=False):
    """The dict form of a scheduler in `configure_optimizers`' return: `{"scheduler": ..., "interval": "step"}`."""

    scheduler: Required[LRSchedulerTypeUnion]
    name: str | None
    interval: str
    frequency: int
    reduce_on_plateau: bool
    monitor: str | None
    strict: bool


class OptimizerConfig(TypedDict):
    """`{"optimizer": opt}`."""

    optimizer: Optimizer


class OptimizerLRSchedulerConfig(TypedDict):
    """`{"optimizer": opt, "lr_scheduler": sched or its dict form, "monitor": "val_loss"}`."""

    optimizer: Optimizer
    lr_scheduler: LRSchedulerTypeUnion | LRSchedulerConfigType
    monitor: NotRequired[str]


# Every return form of `configure_optimizers` (None: no optimizer, e.g. for manual optimization without one).
OptimizerLRScheduler = (
    Optimizer
    | Sequence[Optimizer]
    | tuple[Sequence[Optimizer], Sequence[LRSchedulerTypeUnion | LRSchedulerConfigType]]
    | OptimizerConfig
    | OptimizerLRSchedulerConfig
    | Sequence[OptimizerConfig]
    | Sequence[OptimizerLRSchedulerConfig]
    | None
)
