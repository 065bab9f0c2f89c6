"""Small models and data for tests: fast, deterministic, no downloads."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from trainer import TrainModule


class RandomDataset(Dataset):
    """`length` random vectors of size `size` (seeded), returned as plain tensors."""

    def __init__(self, size: int = 32, length: int = 64, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.data = torch.randn(length, size, generator=gen)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.data[index]


def regression_data(n: int = 64, features: int = 32, seed: int = 0) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=gen)
    y = x[:, :1] * 0.5 - x[:, 1:2] + 0.1 * torch.randn(n, 1, generator=gen)
    return TensorDataset(x, y)


class BoringModel(TrainModule):
    """A linear layer trained on random data; every data hook defined; logs nothing by default."""

    def __init__(self, batch_size: int = 8, length: int = 64) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 2)
        self.batch_size = batch_size
        self.length = length

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return self(batch).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self(batch).sum()
        self.log("val_loss", loss)
        return {"x": loss}

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self(batch).sum()
        self.log("test_loss", loss)
        return {"y": loss}

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, self.length), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, self.length, seed=1), batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, self.length, seed=2), batch_size=self.batch_size)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, self.length, seed=3), batch_size=self.batch_size)


QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
         "enable_model_summary": False, "accelerator": "cpu", "devices": 1}


def every_stage_module(base: type) -> type:
    """A tiny module on `base` (TrainModule, or Lightning's LightningModule for a run beside ours) with a step for
    every stage, a StepLR and loaders of 4 batches: for comparing what runs (hooks, profiler actions), not what it
    learns."""

    class EveryStage(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", self.layer(batch[0]).pow(2).mean())

        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.log("test_loss", self.layer(batch[0]).pow(2).mean())

        def predict_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch[0])

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1)]

        def train_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2)

        val_dataloader = test_dataloader = predict_dataloader = train_dataloader

    return EveryStage
