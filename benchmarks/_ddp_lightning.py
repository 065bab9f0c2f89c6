"""The Lightning variant of benchmarks/ddp.py, in its own module so that only this variant imports Lightning
(ddp_spawn re-imports the script in every rank; Lightning's import takes seconds)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from common import StepClock
from torch import Tensor
from torch.nn import functional as F
from torch.utils.data import DataLoader


class LitBenchModule(pl.LightningModule):
    """benchmarks/ddp.py's BenchModule as a LightningModule: same MLP, data, loss and optimizer."""

    def __init__(self, cfg: Any, make_mlp: Any, make_data: Any) -> None:
        super().__init__()
        self.cfg = cfg
        self.make_data = make_data
        self.net = make_mlp(cfg)

    def setup(self, stage: str) -> None:
        torch.set_num_threads(1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.make_data(self.cfg), batch_size=self.cfg.batch_size, shuffle=True)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.cfg.lr)


class LitStepTimer(pl.Callback):
    """Stamps every batch end on global rank 0 and writes the stamps to `out_file` at the end of training."""

    def __init__(self, out_file: str) -> None:
        self.out_file = out_file
        self.clock = StepClock()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.is_global_zero:
            self.clock.tick()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.is_global_zero:
            Path(self.out_file).write_text(json.dumps({"wall": self.clock.wall, "cpu": self.clock.cpu,
                                                       "threads": torch.get_num_threads()}))


def run_lightning(cfg: Any, module_cls: Any, flags: dict[str, Any], world_size: int) -> dict[str, Any]:
    """One 2-rank fit; the stamps of rank 0. `module_cls` is ours, whose module holds make_mlp / make_data."""
    import logging
    import sys

    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    bench = sys.modules[module_cls.__module__]
    with tempfile.TemporaryDirectory() as tmp:
        out_file = os.path.join(tmp, "stamps.json")
        trainer = pl.Trainer(devices=world_size, strategy="ddp_spawn", max_epochs=cfg.epochs,
                             callbacks=[LitStepTimer(out_file)], **flags)
        trainer.fit(LitBenchModule(cfg, bench.make_mlp, bench.make_data))
        return json.loads(Path(out_file).read_text())
