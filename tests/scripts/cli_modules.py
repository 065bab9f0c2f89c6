"""Classes that tests/test_cli.py names by class_path in its YAML configs (`tests.scripts.cli_modules.X`)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from callbacks import Callback
from tests.helpers.boring import regression_data
from trainer import DataModule, TrainModule


class RegressionData(DataModule):
    """Seeded regression data; the training loader shuffles, so the global seed matters."""

    def __init__(self, batch_size: int = 8, n: int = 64) -> None:
        super().__init__()
        self.batch_size, self.n = batch_size, n

    def train_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(self.n), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(16, seed=1), batch_size=self.batch_size)


class Regressor(TrainModule):
    """A small MLP whose initial weights come from the global seed."""

    def __init__(self, hidden: int = 8, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(32, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class WeightDump(Callback):
    """Saves each rank's final weights to `<out>/rank<global_rank>.pt`."""

    def __init__(self, out: str) -> None:
        self.out = out

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        os.makedirs(self.out, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        torch.save({"state_dict": state, "global_step": trainer.global_step, "world_size": trainer.world_size},
                   os.path.join(self.out, f"rank{trainer.global_rank}.pt"))
