"""The model and data shared by a Lightning 2.x run and ours, and the script that wrote the checked-in
Lightning checkpoint (tests/compat/fixtures/lightning_2_6_6.ckpt).

Run once with Lightning installed: `python -m tests.compat.lightning_fixture`. The checkpoint is ModelCheckpoint's
file at the end of epoch 0 of a 3-epoch SGD + MultiStepLR run (4 batches per epoch, no shuffling), so a
resume continues at epoch 1, step 4. Its hyperparameters hold an `argparse.Namespace` and a class, which
`torch.load(weights_only=True)` refuses, so the file also exercises "load what is safe, name the rest".
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

FIXTURE = Path(__file__).parent / "fixtures" / "lightning_2_6_6.ckpt"
BATCHES_PER_EPOCH, BATCH_SIZE = 4, 4


def data() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES_PER_EPOCH * BATCH_SIZE, 4, generator=gen)
    return TensorDataset(x, x.sum(dim=1, keepdim=True))


def loader() -> DataLoader:
    return DataLoader(data(), batch_size=BATCH_SIZE, shuffle=False)


def build_net(hidden: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def loss_of(net: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(net(x), y)


def optimizers_of(module: nn.Module, lr: float) -> dict[str, Any]:
    opt = torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)
    return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[1, 2], gamma=0.5)}


def lightning_module_class() -> type:
    """The Lightning side (imports Lightning: call it only where Lightning is installed)."""
    import lightning.pytorch as pl

    class LitRegressor(pl.LightningModule):
        def __init__(self, hidden: int = 8, lr: float = 0.05, options: Any = None, activation: Any = nn.Tanh) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = build_net(hidden)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return loss_of(self.net, batch)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", loss_of(self.net, batch))

        def configure_optimizers(self) -> Any:
            return optimizers_of(self, self.hparams.lr)

    return LitRegressor


def lightning_trainer(root: Path, max_epochs: int, **kwargs: Any) -> Any:
    import lightning.pytorch as pl

    return pl.Trainer(max_epochs=max_epochs, default_root_dir=root, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", devices=1, **kwargs)


def write_checkpoints(root: Path, max_epochs: int = 3) -> list[Path]:
    """Run Lightning for `max_epochs` with a checkpoint at every epoch end; return the files, oldest first."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    model = lightning_module_class()(hidden=8, lr=0.05, options=argparse.Namespace(depth=2), activation=nn.Tanh)
    ckpt = ModelCheckpoint(dirpath=root, save_top_k=-1, filename="{epoch}")
    lightning_trainer(root, max_epochs, callbacks=[ckpt]).fit(model, loader())
    return sorted(root.glob("epoch=*.ckpt"))


if __name__ == "__main__":
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        first = write_checkpoints(Path(tmp))[0]
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(first, FIXTURE)
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
