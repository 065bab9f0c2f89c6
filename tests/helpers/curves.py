"""A run whose validation logs a given curve (one value per epoch), under our Trainer and under Lightning's, so a
monitoring callback (ModelCheckpoint, EarlyStopping) can be compared with Lightning's own on the same values."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from tests.helpers.boring import QUIET, BoringModel, RandomDataset
from trainer import Trainer

FLAGS = {"limit_train_batches": 2, "limit_val_batches": 1, "num_sanity_val_steps": 0}


class Curve(BoringModel):
    """Logs `metric` = `values[current_epoch]` in validation (a value per validation: the epoch picks it)."""

    def __init__(self, values: list[float], metric: str = "val_score") -> None:
        super().__init__()
        self.values, self.metric = values, metric

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.log(self.metric, float(self.values[self.current_epoch]))


def fit_ours(callbacks: list[Any], values: list[float], metric: str = "val_score", **flags: Any) -> Trainer:
    options = {**QUIET, "enable_checkpointing": True, **FLAGS, "max_epochs": len(values), **flags}
    trainer = Trainer(callbacks=callbacks, **options)
    trainer.fit(Curve(values, metric))
    return trainer


def fit_lightning(callbacks: list[Any], values: list[float], metric: str = "val_score", **flags: Any) -> Any:
    """The same run under Lightning 2.x (skips the test where Lightning is not installed)."""
    pl = pytest.importorskip("lightning.pytorch")

    class LightningCurve(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch).sum()

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            self.log(metric, float(values[self.current_epoch]))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(RandomDataset(32, 64), batch_size=8)

        def val_dataloader(self) -> DataLoader:
            return DataLoader(RandomDataset(32, 64, seed=1), batch_size=8)

    options = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False, "accelerator": "cpu",
               "devices": 1, **FLAGS, "max_epochs": len(values), **flags}
    trainer = pl.Trainer(callbacks=callbacks, **options)
    trainer.fit(LightningCurve())
    return trainer
