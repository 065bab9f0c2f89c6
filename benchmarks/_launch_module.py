"""The TrainModule of benchmarks/launch.py, in a module of its own: `ddp_spawn` pickles it, so it must live at a
module's top level, and the raw variant must not import the framework."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import TrainModule


class LaunchModule(TrainModule):
    """first_step.py's MLP and data; rank 0 writes the wall clock to `stamp` when its first step starts."""

    def __init__(self, data: TensorDataset, net: torch.nn.Module, stamp: str) -> None:
        super().__init__()
        self.data, self.net, self.stamp = data, net, stamp
        self.stamped = False

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.data, batch_size=64, shuffle=True)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if not self.stamped and self.global_rank == 0:
            self.stamped = True
            Path(self.stamp).write_text(repr(time.time()))
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)
