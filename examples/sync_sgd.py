"""Synchronous SGD written by hand gives the same weights as `Trainer(strategy="ddp")`.

Data-parallel training is four steps: every rank starts from rank 0's weights, computes gradients on its own
shard of the data, averages the gradients with one all-reduce, and takes the same optimizer step. Part 1 does
exactly that with bare torch.distributed (gloo, ranks started by torch.multiprocessing). Part 2 trains the same
model on the same data with `Trainer(strategy="ddp", devices=2, accelerator="cpu")`. The script prints both
results and their largest absolute difference, and exits with code 1 if it is above 1e-6.

    python examples/sync_sgd.py                                  # 2 CPU ranks, 3 epochs
    python examples/sync_sgd.py --strategy ddp_spawn --devices 3 --max-epochs 1
    python examples/sync_sgd.py --strategy zero3 --precision bf16-mixed
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from callbacks import Callback
from strategies.launch.shutdown import shutdown_distributed
from trainer import Trainer, TrainModule, seed_everything

OUT_ENV = "SYNC_SGD_OUT"  # set by the first process; its presence also marks the Trainer's re-run ranks
TOLERANCE = 1e-6


def make_dataset(n: int = 512, features: int = 16, classes: int = 4) -> TensorDataset:
    """Points labelled by a random linear teacher; a private generator, so every process builds the same data."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(n, features, generator=gen)
    y = (x @ torch.randn(features, classes, generator=gen)).argmax(dim=1)
    return TensorDataset(x, y)


class Classifier(TrainModule):
    """A small MLP; `loss()` is shared by the Trainer's training_step and the hand-written loop."""

    def __init__(self, lr: float = 0.1, momentum: float = 0.9) -> None:
        super().__init__()
        self.lr, self.momentum = lr, momentum
        self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


# --- part 1: by hand -------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hand_written_rank(rank: int, args: argparse.Namespace, port: int, out: str) -> None:
    """One rank of plain synchronous SGD; rank 0 saves the final weights to `out`."""
    torch.set_num_threads(1)  # several ranks share the cores; more threads each would oversubscribe them
    cuda = args.accelerator == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=args.devices)
    try:
        dtype = torch.float64 if args.precision == "64-true" else torch.float32
        torch.manual_seed(args.seed)
        model = Classifier(args.lr).to(device, dtype)
        for p in model.parameters():  # 1. everybody starts from rank 0's weights
            dist.broadcast(p.data, src=0)
        opt = torch.optim.SGD(model.parameters(), lr=model.lr, momentum=model.momentum)
        data = make_dataset()
        # 2. each rank its own shard, reshuffled every epoch from the same seed on every rank
        sampler = DistributedSampler(data, num_replicas=args.devices, rank=rank, shuffle=True, seed=args.seed)
        loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
        autocast = args.precision == "bf16-mixed"
        epochs, batches = (1, 1) if args.fast_dev_run else (args.max_epochs, len(loader))
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for _, (x, y) in zip(range(batches), loader, strict=False):
                with torch.autocast(device.type, dtype=torch.bfloat16) if autocast else nullcontext():
                    loss = model.loss((x.to(device, dtype), y.to(device)))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                for p in model.parameters():  # 3. average the gradients over the ranks
                    # DDP divides by the world size *before* the sum (it keeps fp16 sums from overflowing);
                    # we do the same, so the rounding is the same too.
                    p.grad /= args.devices
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                opt.step()  # 4. the same step on every rank keeps the replicas identical
        if rank == 0:
            torch.save({k: v.cpu() for k, v in model.state_dict().items()}, out)
    finally:
        # Not just dist.destroy_process_group(): on torch 2.14 with gloo a rank can then still abort at exit
        # (`terminate called without an active exception`, a gloo worker thread racing interpreter shutdown;
        # docs/reliability.md, "A finished run exits 0 on every rank"). This destroys the group and waits for
        # gloo's threads to go idle, as the Trainer's own ranks do.
        shutdown_distributed()


# --- part 2: the Trainer ---------------------------------------------------------------------------------
class SaveFinalWeights(Callback):
    """Saves the full final weights: `save_checkpoint` runs on every rank, the strategy gathers and writes."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        trainer.save_checkpoint(self.path, weights_only=True)


def train_with_trainer(args: argparse.Namespace, out: str) -> None:
    seed_everything(args.seed)  # also seeds the DistributedSampler the Trainer injects
    model = Classifier(args.lr)
    loader = DataLoader(make_dataset(), batch_size=args.batch_size, shuffle=True)
    trainer = Trainer(
        strategy=args.strategy, devices=args.devices, accelerator=args.accelerator, precision=args.precision,
        max_epochs=args.max_epochs, fast_dev_run=args.fast_dev_run, callbacks=[SaveFinalWeights(out)],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=os.path.dirname(out),
    )
    trainer.fit(model, loader)


def compare(by_hand: dict[str, torch.Tensor], by_trainer: dict[str, torch.Tensor]) -> float:
    """Print both weight sets in brief and return their largest absolute difference."""
    diff = 0.0
    for name, hand in by_hand.items():
        other = by_trainer[name]
        diff = max(diff, (hand.double() - other.double()).abs().max().item())
        print(f"{name:14s} by hand {hand.flatten()[:3].tolist()}  trainer {other.flatten()[:3].tolist()}")
    return diff


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default="ddp", choices=["ddp", "ddp_spawn", "zero1", "zero2", "zero3"])
    p.add_argument("--devices", type=int, default=2, help="number of ranks")
    p.add_argument("--accelerator", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--precision", default="32-true", choices=["32-true", "64-true", "bf16-mixed"])
    p.add_argument("--max-epochs", type=int, default=3)
    p.add_argument("--fast-dev-run", action="store_true", help="one batch of one epoch")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    if OUT_ENV in os.environ:  # a rank the Trainer started by re-running this script: only part 2
        train_with_trainer(args, str(Path(os.environ[OUT_ENV]) / "trainer.pt"))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        hand_path, trainer_path = str(Path(tmp) / "by_hand.pt"), str(Path(tmp) / "trainer.pt")
        mp.start_processes(hand_written_rank, args=(args, free_port(), hand_path), nprocs=args.devices,
                           start_method="spawn")
        os.environ[OUT_ENV] = tmp  # inherited by the ranks the Trainer starts
        train_with_trainer(args, trainer_path)
        by_hand: dict[str, Any] = torch.load(hand_path, weights_only=True)
        by_trainer: dict[str, Any] = torch.load(trainer_path, weights_only=True)["state_dict"]
    diff = compare(by_hand, by_trainer)
    print(f"ranks: {args.devices}, strategy: {args.strategy}, precision: {args.precision}")
    print(f"max abs difference: {diff:.3e}")
    if diff > TOLERANCE:
        print(f"FAIL: the Trainer's weights differ from hand-written synchronous SGD by more than {TOLERANCE}")
        return 1
    print("OK: identical within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
