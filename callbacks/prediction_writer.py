"""BasePredictionWriter: Lightning's base class for writing predictions out as they are made, per batch or at the
end of the predict epoch, on every rank (each rank writes its own shard; `batch_indices` say which samples of the
data set each batch holds, so the files of all ranks together cover it once)."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from strategies.exceptions import MisconfigurationError

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.trainer import Trainer

class WriteInterval(str, Enum):
    """When a BasePredictionWriter writes (a str enum, as Lightning's: `WriteInterval("batch") == "batch"`)."""

    BATCH = "batch"
    EPOCH = "epoch"
    BATCH_AND_EPOCH = "batch_and_epoch"

    @property
    def on_batch(self) -> bool:
        """Whether it writes after every predict batch."""
        return self in (WriteInterval.BATCH, WriteInterval.BATCH_AND_EPOCH)

    @property
    def on_epoch(self) -> bool:
        """Whether it writes at the end of the predict epoch."""
        return self in (WriteInterval.EPOCH, WriteInterval.BATCH_AND_EPOCH)


class BasePredictionWriter(Callback):
    """Write predictions per batch (`write_interval="batch"`), at the end of the predict epoch (`"epoch"`), or
    both (`"batch_and_epoch"`): subclass it and implement `write_on_batch_end` and/or `write_on_epoch_end`.

    Each rank writes what it predicted; `batch_indices` are the data set's indices of the samples in the batch
    (at epoch end: per loader, per batch), so per-rank files can be joined back into the data set's order. With
    a writer, `trainer.predict(model, return_predictions=False)` keeps no predictions in memory (at
    `"epoch"`, only until the epoch's write).

    Example:
        ```python
        class Writer(BasePredictionWriter):
            def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                                   dataloader_idx):
                torch.save({"indices": batch_indices, "prediction": prediction},
                           f"out/rank{trainer.global_rank}_{dataloader_idx}_{batch_idx}.pt")

        trainer = Trainer(callbacks=[Writer(write_interval="batch")])
        trainer.predict(model, return_predictions=False)
        ```
    """

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in [interval.value for interval in WriteInterval]:
            raise MisconfigurationError(
                f"`write_interval` should be one of {[interval.value for interval in WriteInterval]}.")
        self.interval = WriteInterval(write_interval)

    def write_on_batch_end(self, trainer: Trainer, pl_module: TrainModule, prediction: Any,
                           batch_indices: Sequence[int] | None, batch: Any, batch_idx: int,
                           dataloader_idx: int) -> None:
        """Write one batch's prediction (called after `on_predict_batch_end` of earlier callbacks in the list)."""
        raise NotImplementedError(f"{type(self).__name__} writes per batch: implement write_on_batch_end().")

    def write_on_epoch_end(self, trainer: Trainer, pl_module: TrainModule, predictions: Sequence[Any],
                           batch_indices: Sequence[Any]) -> None:
        """Write all of this rank's predictions (`trainer.predict_loop.predictions`; per loader when several)
        with their indices (always per loader: `batch_indices[dataloader_idx][batch]`)."""
        raise NotImplementedError(f"{type(self).__name__} writes at epoch end: implement write_on_epoch_end().")

    def on_predict_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                             batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.interval.on_batch:
            indices = trainer.predict_loop.current_batch_indices
            self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.interval.on_epoch:
            loop = trainer.predict_loop
            self.write_on_epoch_end(trainer, pl_module, loop.predictions, loop.epoch_batch_indices)
