"""GradientAccumulationScheduler: Lightning's callback that changes `accumulate_grad_batches` by epoch.

It sets `trainer.accumulate_grad_batches` at the start of every training epoch, which the loop reads at each batch
(the accumulation windows are counted from each epoch's first batch). Nothing is checkpointed: the factor is a
function of the epoch, and a resumed run calls `on_train_epoch_start` for the epoch it resumes in before its first
batch, so the factor is right there too, mid-epoch included.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from strategies.comm.distributed import rank_zero_warn
from strategies.exceptions import MisconfigurationError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer


class GradientAccumulationScheduler(Callback):
    """Accumulate gradients over `scheduling[epoch]` batches from that epoch (0-based) on.

    Epochs before the first key accumulate 1 batch (Lightning adds `{0: 1}` to the dict). It cannot be combined with
    `Trainer(accumulate_grad_batches=N)` for N != 1, nor with manual optimization (as in Lightning).

    Args:
        scheduling: `{epoch: factor}`, epochs ints >= 0, factors ints >= 1.

    Raises:
        TypeError: `scheduling` is empty.
        MisconfigurationError: an epoch or a factor is not an int in range.

    Example:
        ```python
        # 1 batch per step in epochs 0-3, 2 in epochs 4-7, 4 from epoch 8 on
        accumulator = GradientAccumulationScheduler(scheduling={4: 2, 8: 4})
        trainer = Trainer(max_epochs=10, callbacks=[accumulator])
        ```
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not scheduling:
            raise TypeError("GradientAccumulationScheduler(scheduling={}): give at least one {epoch: factor} entry.")
        if any(isinstance(key, bool) or not isinstance(key, int) or key < 0 for key in scheduling):
            raise MisconfigurationError(f"GradientAccumulationScheduler: epochs must be ints >= 0 (0-based); got "
                                        f"{list(scheduling.keys())}.")
        if any(isinstance(value, bool) or not isinstance(value, int) or value < 1 for value in scheduling.values()):
            raise MisconfigurationError(f"GradientAccumulationScheduler: accumulation factors must be ints >= 1; "
                                        f"got {list(scheduling.values())}.")
        if min(scheduling) != 0:
            scheduling.update({0: 1})  # Lightning updates the dict it was given
        self.scheduling = scheduling
        self.epochs = sorted(scheduling)

    def going_to_accumulate_grad_batches(self) -> bool:
        """Whether some epoch accumulates more than one batch."""
        return any(value > 1 for value in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The factor for `epoch` (0-based): that of the last scheduled epoch at or before it."""
        return next((self.scheduling[start] for start in reversed(self.epochs) if epoch >= start), 1)

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Lightning's checks, before the first epoch."""
        if not pl_module.automatic_optimization:
            raise RuntimeError("GradientAccumulationScheduler needs automatic optimization: with "
                               "`self.automatic_optimization = False` accumulate in training_step, or remove the "
                               "callback.")
        overridden = [name for name in ("optimizer_step", "optimizer_zero_grad") if _overrides(pl_module, name)]
        if overridden and self.going_to_accumulate_grad_batches():
            rank_zero_warn(f"{type(pl_module).__name__} overrides {' and '.join(overridden)}: with gradient "
                           "accumulation they are called once per optimizer step, not on every batch.")
        if trainer.fit_state.spec.accumulate_grad_batches != 1:
            raise ValueError(
                f"Trainer(accumulate_grad_batches={trainer.fit_state.spec.accumulate_grad_batches}) and "
                "GradientAccumulationScheduler both set the accumulation: remove the flag or the callback.")

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)


def _overrides(module: Any, name: str) -> bool:
    from trainer.core.module import TrainModule
    from trainer.hooks import is_overridden

    return is_overridden(module, name, TrainModule)
