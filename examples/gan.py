"""A small GAN on scikit-learn's 8x8 handwritten digits, with two optimizers and manual optimization.

Shows `self.automatic_optimization = False`: training_step gets both optimizers from `self.optimizers()` and
runs the two GAN updates itself with `self.manual_backward(loss)` and `opt.step()`, which still go through the
strategy and precision (gradient sync, autocast, loss scaling). The code is plain: no freezing and unfreezing
of the other network. When training ends, rank 0 prints a few generated digits as ASCII art.
Multi-process: every strategy works. Under DDP ("ddp", "ddp_spawn", "zero1") the script passes
`find_unused_parameters=True`: each backward of a GAN step reaches only part of the parameters.

    python examples/gan.py                           # about a minute on a CPU
    python examples/gan.py --fast-dev-run            # one batch, nothing written
    python -m trainer fit --config examples/configs/gan.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from strategies import DDPStrategy, ZeroStrategy
from trainer import DataModule, Trainer, TrainModule, seed_everything

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "runs" / "gan"  # under the git-ignored runs/
RAMP = " .:-=+*#%@"  # dark to bright, for printing 8x8 images


class DigitImages(DataModule):
    """All 1797 digits as flat 64-pixel vectors scaled to [-1, 1] (the generator ends in tanh); labels unused."""

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        images = torch.tensor(load_digits().images, dtype=torch.float32).flatten(1)  # pixels are 0..16
        self.train_set = TensorDataset(images / 8.0 - 1.0)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)


class DigitsGAN(TrainModule):
    """Generator: noise (latent_dim) -> 64 pixels. Discriminator: 64 pixels -> one logit (real or generated)."""

    def __init__(self, latent_dim: int = 32, hidden: int = 256, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False  # training_step steps the optimizers itself
        self.generator = nn.Sequential(
            nn.Linear(latent_dim, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2),
            nn.Linear(hidden, 64), nn.Tanh(),
        )
        self.discriminator = nn.Sequential(
            nn.Linear(64, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2),
            nn.Linear(hidden, 1),
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.generator(z)

    def training_step(self, batch: tuple[torch.Tensor], batch_idx: int) -> None:
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        fake = self(torch.randn(real.shape[0], self.hparams.latent_dim, device=real.device))

        # 1. Discriminator: tell real from generated. `detach` keeps this loss from reaching the generator.
        d_real, d_fake = self.discriminator(real), self.discriminator(fake.detach())
        d_loss = (F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real))
                  + F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake))) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()

        # 2. Generator: make the (just updated) discriminator call its images real. This backward also leaves
        #    gradients on the discriminator; opt_d.zero_grad() clears them before they are ever used.
        d_on_fake = self.discriminator(fake)
        g_loss = F.binary_cross_entropy_with_logits(d_on_fake, torch.ones_like(d_on_fake))
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()

        self.log_dict({"d_loss": d_loss, "g_loss": g_loss}, prog_bar=True, on_epoch=True)
        # How sure the discriminator is, on average: near 0.5 for both when the two are in balance.
        self.log_dict({"p_real": torch.sigmoid(d_real).mean(), "p_fake": torch.sigmoid(d_fake).mean()}, on_epoch=True)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        betas = (0.5, 0.999)  # the usual GAN choice: less momentum keeps the two-player game from oscillating
        return [torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr, betas=betas),
                torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr, betas=betas)]

    @torch.no_grad()
    def sample(self, n: int, seed: int = 0) -> torch.Tensor:
        """`n` generated 8x8 images in [0, 1], from fixed noise."""
        z = torch.randn(n, self.hparams.latent_dim, generator=torch.Generator().manual_seed(seed))
        return ((self(z.to(self.device)).float().cpu() + 1) / 2).clamp(0, 1).view(n, 8, 8)


def ascii_art(images: torch.Tensor) -> str:
    """Images side by side, one character per pixel."""
    rows = []
    for y in range(images.shape[1]):
        cells = ["".join(RAMP[int(v * (len(RAMP) - 1))] * 2 for v in img[y].tolist()) for img in images]
        rows.append("  ".join(cells))
    return "\n".join(rows)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default="auto",
                   help='"auto", "single", "ddp", "ddp_spawn", "zero1", "zero2", "zero3"')
    p.add_argument("--devices", default="1", help='a count, or "auto"')
    p.add_argument("--accelerator", default="auto", help='"auto", "cpu", "gpu", ...')
    p.add_argument("--precision", default="32-true", help='"32-true", "16-mixed", "bf16-mixed", ...')
    p.add_argument("--max-epochs", type=int, default=60)
    p.add_argument("--fast-dev-run", action="store_true", help="one batch; no logs or checkpoints")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--root", default=str(DEFAULT_ROOT), help="default_root_dir: logs and checkpoints go here")
    p.add_argument("--no-progress-bar", action="store_true")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)  # small MLPs: one thread is fastest and does not fight other ranks for the cores
    seed_everything(args.seed)
    model, data = DigitsGAN(hidden=args.hidden, lr=args.lr), DigitImages(batch_size=args.batch_size)
    strategy: Any = args.strategy
    if strategy in ("ddp", "ddp_spawn"):  # the D and G backwards each reach only some of the parameters
        strategy = DDPStrategy(find_unused_parameters=True, start_method="spawn" if strategy == "ddp_spawn"
                               else "subprocess")
    elif strategy == "zero1":  # DDP underneath, too
        strategy = ZeroStrategy(stage=1, find_unused_parameters=True)
    trainer = Trainer(
        strategy=strategy, devices=int(args.devices) if args.devices.isdigit() else args.devices,
        accelerator=args.accelerator, precision=args.precision, max_epochs=args.max_epochs,
        fast_dev_run=args.fast_dev_run, default_root_dir=args.root, enable_progress_bar=not args.no_progress_bar,
    )
    trainer.fit(model, datamodule=data)
    images = model.sample(6)  # on every rank: under a sharded strategy the forward is a collective
    if trainer.is_global_zero:
        epoch_means = {k: round(float(v), 4) for k, v in trainer.callback_metrics.items() if k.endswith("_epoch")}
        print(f"last epoch: {epoch_means}")
        print(f"generated digits:\n{ascii_art(images)}")


if __name__ == "__main__":
    main()
