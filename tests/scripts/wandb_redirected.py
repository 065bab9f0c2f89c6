"""A W&B offline run as a cluster job runs it: stdout and stderr go to a file (not a terminal), the default progress
bar is on, and the run fits, validates and tests. `python wandb_redirected.py ours|lightning SAVE_DIR`: the same
module under our Trainer or under Lightning's, for tests/loggers/test_wandb.py to compare the run files."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

SIDE, SAVE_DIR = sys.argv[1], sys.argv[2]
if SIDE == "lightning":
    import lightning.pytorch as pl

    Module, Trainer, WandbLogger = pl.LightningModule, pl.Trainer, pl.loggers.WandbLogger
else:
    from trainer import Trainer
    from trainer import TrainModule as Module
    from trainer.loggers import WandbLogger


def _data(seed: int) -> DataLoader:
    gen = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(24, 4, generator=gen)), batch_size=4)


class Logs(Module):  # type: ignore[misc,valid-type]
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train_loss", loss, prog_bar=True)
        self.log("train_mean", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("val_loss", self.layer(batch[0]).pow(2).mean(), prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("test_loss", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> DataLoader:
        return _data(0)

    def val_dataloader(self) -> DataLoader:
        return _data(1)

    def test_dataloader(self) -> DataLoader:
        return _data(2)


logger = WandbLogger(project="redirected", save_dir=SAVE_DIR, offline=True)
trainer = Trainer(logger=logger, max_epochs=2, limit_train_batches=3, limit_val_batches=2, limit_test_batches=2,
                  log_every_n_steps=1, enable_checkpointing=False, enable_model_summary=False,
                  accelerator="cpu", devices=1)
model = Logs()
trainer.fit(model)
trainer.test(model, verbose=False)
print("run", logger.version, "done", flush=True)
