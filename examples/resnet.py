"""Train torchvision's ResNet-18 (random init, 10 classes) on synthetic 3x32x32 images.

Shows an off-the-shelf torchvision model inside a TrainModule, a DataModule that generates its data (no download),
SGD with momentum and a per-epoch cosine schedule, and train/val loss and accuracy logged per step and per epoch.
The images are one fixed random "prototype" per class plus noise, so the labels are learnable and the accuracy
climbs. Strategy, precision and devices are flags; the module does not change.

    python examples/resnet.py --max-epochs 2
    python examples/resnet.py --accelerator cpu --devices 2 --strategy ddp --precision bf16-mixed
    python examples/resnet.py --fast-dev-run                      # one batch of each loop, nothing written
    python -m trainer fit --config examples/configs/resnet.yaml   # the same from YAML
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset
from torchvision.models import resnet18

from trainer import DataModule, Trainer, TrainModule, seed_everything

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "runs" / "resnet"  # under the git-ignored runs/


class SyntheticImages(DataModule):
    """`num_classes` random prototype images; each sample is its class's prototype plus Gaussian noise.

    A private generator makes the data identical in every process and independent of the global seed.
    """

    def __init__(self, num_train: int = 2048, num_val: int = 512, num_classes: int = 10, noise: float = 1.0,
                 batch_size: int = 64, data_seed: int = 0) -> None:
        super().__init__()
        self.num_train, self.num_val, self.num_classes = num_train, num_val, num_classes
        self.noise, self.batch_size, self.data_seed = noise, batch_size, data_seed

    def _make(self, n: int, gen: torch.Generator, prototypes: torch.Tensor) -> TensorDataset:
        labels = torch.randint(0, self.num_classes, (n,), generator=gen)
        images = prototypes[labels] + self.noise * torch.randn(n, 3, 32, 32, generator=gen)
        return TensorDataset(images, labels)

    def setup(self, stage: str) -> None:
        gen = torch.Generator().manual_seed(self.data_seed)
        prototypes = torch.randn(self.num_classes, 3, 32, 32, generator=gen)
        self.train_set = self._make(self.num_train, gen, prototypes)
        self.val_set = self._make(self.num_val, gen, prototypes)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)


class ResNetClassifier(TrainModule):
    """torchvision ResNet-18, `weights=None`. `small_input_stem` swaps the 7x7/stride-2 stem and max-pool for one
    3x3/stride-1 conv, as is usual for 32x32 inputs: more accurate, but about 16x the compute."""

    def __init__(self, num_classes: int = 10, lr: float = 0.05, momentum: float = 0.9, weight_decay: float = 5e-4,
                 small_input_stem: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = resnet18(weights=None, num_classes=num_classes)
        if small_input_stem:
            self.net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
            self.net.maxpool = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _loss_acc(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits, y), (logits.argmax(dim=1) == y).float().mean()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, acc = self._loss_acc(batch)
        # Per step (the default in training_step) and as a batch-size-weighted epoch mean.
        self.log("train_loss", loss, prog_bar=True, on_epoch=True)
        self.log("train_acc", acc, prog_bar=True, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, acc = self._loss_acc(batch)
        self.log_dict({"val_loss": loss, "val_acc": acc}, prog_bar=True, sync_dist=True)  # global over ranks

    def configure_optimizers(self) -> dict[str, Any]:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum,
                              weight_decay=self.hparams.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(self.trainer.max_epochs, 1))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "epoch"}}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default="auto", help='"auto", "single", "ddp", "ddp_spawn", "zero1", "zero2", ...')
    p.add_argument("--devices", default="1", help='a count, or "auto"')
    p.add_argument("--accelerator", default="auto", help='"auto", "cpu", "gpu", ...')
    p.add_argument("--precision", default="32-true", help='"32-true", "16-mixed", "bf16-mixed", ...')
    p.add_argument("--max-epochs", type=int, default=5)
    p.add_argument("--fast-dev-run", action="store_true", help="one batch of each loop; no logs or checkpoints")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--num-train", type=int, default=2048, help="synthetic training images")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--small-input-stem", action="store_true", help="3x3 stem, no max-pool (CIFAR style)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--root", default=str(DEFAULT_ROOT), help="default_root_dir: logs and checkpoints go here")
    p.add_argument("--no-progress-bar", action="store_true")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    seed_everything(args.seed)  # before the model is built: weights and shuffling follow the seed
    model = ResNetClassifier(lr=args.lr, small_input_stem=args.small_input_stem)
    data = SyntheticImages(num_train=args.num_train, batch_size=args.batch_size)
    trainer = Trainer(
        strategy=args.strategy, devices=int(args.devices) if args.devices.isdigit() else args.devices,
        accelerator=args.accelerator, precision=args.precision, max_epochs=args.max_epochs,
        fast_dev_run=args.fast_dev_run, default_root_dir=args.root, enable_progress_bar=not args.no_progress_bar,
    )
    trainer.fit(model, datamodule=data)
    if trainer.is_global_zero:
        metrics = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items()}
        print(f"final metrics: {metrics}")


if __name__ == "__main__":
    main()
