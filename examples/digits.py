"""Train the ConvNet of PyTorch's DDP tutorial on scikit-learn's 8x8 handwritten digits.

The digits ship with scikit-learn, so the demo needs no download and trains in seconds on a CPU.
The model knows nothing about devices or strategies: `--strategy ddp --devices 2` scales it out unchanged.

    python examples/digits.py                          # single device, prints accuracy, time, paths
    python examples/digits.py --max-epochs 1 --no-progress-bar
    python examples/digits.py --find-lr                # Tuner.lr_find first, then train with its suggestion
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, Trainer, TrainModule, seed_everything
from trainer.tuner import Tuner

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "runs" / "digits"  # under the git-ignored runs/


class DigitsData(DataModule):
    """The 1797 digits as tensors, split once by a fixed seed so every run and every rank sees the same split."""

    def __init__(self, batch_size: int = 64, val_fraction: float = 0.2, split_seed: int = 0) -> None:
        super().__init__()
        self.batch_size, self.val_fraction, self.split_seed = batch_size, val_fraction, split_seed

    def setup(self, stage: str) -> None:
        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # pixels are 0..16
        labels = torch.tensor(digits.target, dtype=torch.long)
        # A private generator: the split must not depend on (or consume) the global, --seed driven RNG.
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.split_seed))
        n_val = int(len(labels) * self.val_fraction)
        val_idx, train_idx = order[:n_val], order[n_val:]
        self.train_set = TensorDataset(images[train_idx], labels[train_idx])
        self.val_set = TensorDataset(images[val_idx], labels[val_idx])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


class ConvNet(TrainModule):
    """Two conv blocks (Conv2d, BatchNorm2d, ReLU, MaxPool2d) and a Linear head; 8x8 -> 4x4 -> 2x2."""

    def __init__(self, num_classes: int = 10, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()  # num_classes and lr go into checkpoints: load_from_checkpoint rebuilds this
        self.layer1 = nn.Sequential(
            nn.Conv2d(1, 16, kernel_size=5, padding=2), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.layer2 = nn.Sequential(
            nn.Conv2d(16, 32, kernel_size=5, padding=2), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.fc = nn.Linear(32 * 2 * 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.layer2(self.layer1(x)).flatten(1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        # sync_dist: under DDP each rank sees a shard of the validation set; report the global figure.
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True, sync_dist=True)
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default="auto", help='"auto", "single", "dp", "ddp", "zero1", ...')
    p.add_argument("--devices", default="1", help='a count, or "auto"')
    p.add_argument("--num-nodes", type=int, default=1, help="machines; see docs/distributed.md")
    p.add_argument("--accelerator", default="auto", help='"auto", "cpu", "gpu", ...')
    p.add_argument("--precision", default="32-true", help='"32-true", "16-mixed", "bf16-mixed", ...')
    p.add_argument("--max-epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--root", default=str(DEFAULT_ROOT), help="default_root_dir: logs and checkpoints go here")
    p.add_argument("--no-progress-bar", action="store_true")
    p.add_argument("--find-lr", action="store_true", help="run Tuner.lr_find first and train with its suggestion")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    # A 15k-parameter net on 8x8 images: one thread per process is fastest, and it does not stall when the
    # CPU is shared (other jobs, or several DDP ranks), where two OpenMP threads each can be 5x slower.
    torch.set_num_threads(1)
    seed_everything(args.seed)  # before the model is built: weights and shuffling follow the seed
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    model, data = ConvNet(lr=args.lr), DigitsData(batch_size=args.batch_size)
    trainer = Trainer(
        strategy=args.strategy, devices=devices, num_nodes=args.num_nodes, accelerator=args.accelerator,
        precision=args.precision,
        max_epochs=args.max_epochs, default_root_dir=args.root, enable_progress_bar=not args.no_progress_bar,
    )
    if args.find_lr:  # the range test: the suggestion replaces --lr (model.hparams.lr), the plot goes to --root
        finder = Tuner(trainer).lr_find(model, datamodule=data, min_lr=1e-5, max_lr=1.0)
        if trainer.is_global_zero and finder is not None:
            print(f"lr_find suggestion:        {model.hparams.lr:.3g} (plot: {finder.plot_path})")
    start = time.perf_counter()
    trainer.fit(model, datamodule=data)
    fit_seconds = time.perf_counter() - start
    if trainer.is_global_zero:  # under DDP every rank gets here; one report is enough
        print(f"final validation accuracy: {float(trainer.callback_metrics['val_acc']):.4f}")
        print(f"fit wall time:             {fit_seconds:.1f} s")
        print(f"logs:                      {trainer.log_dir}")
        print(f"checkpoint:                {trainer.checkpoint_callback.best_model_path}")


if __name__ == "__main__":
    main()
