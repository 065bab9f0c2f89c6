"""A small character-level GPT trained on this project's own documentation (docs/*.md).

Shows a transformer built from torch.nn pieces (causal attention by F.scaled_dot_product_attention), AdamW with
weight decay on matrices only, gradient clipping by a Trainer flag, train/val loss, and one module under every
strategy: `--strategy zero2`/`zero3` shard it with FSDP2, `--strategy model_parallel` splits every block's heads
and MLP over the ranks (tensor parallelism, `configure_model`), `--precision bf16-mixed` runs it under autocast.
At the end `save_checkpoint` gathers the (maybe sharded) weights into one file; rank 0 reloads it and samples text.

    python examples/gpt.py --max-epochs 2
    python examples/gpt.py --accelerator cpu --devices 2 --strategy zero3 --precision bf16-mixed
    python examples/gpt.py --accelerator cpu --devices 4 --strategy model_parallel --data-parallel 2   # 2x2 mesh
    python examples/gpt.py --fast-dev-run --n-layer 1 --n-embd 32 --block-size 32
    python -m trainer fit --config examples/configs/gpt.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from strategies import ModelParallelStrategy, ZeroStrategy
from trainer import DataModule, Trainer, TrainModule, seed_everything

DOCS = Path(__file__).resolve().parent.parent / "docs"
DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "runs" / "gpt"  # under the git-ignored runs/
# A fixed vocabulary (newline, tab, printable ASCII, "unknown"): the module is built without the data (as in YAML).
CHARS = "\n\t" + "".join(chr(c) for c in range(32, 127))
UNKNOWN = len(CHARS)
VOCAB_SIZE = len(CHARS) + 1
_INDEX = {ch: i for i, ch in enumerate(CHARS)}


def encode(text: str) -> torch.Tensor:
    return torch.tensor([_INDEX.get(ch, UNKNOWN) for ch in text], dtype=torch.long)


def decode(ids: torch.Tensor) -> str:
    return "".join(CHARS[i] if i < UNKNOWN else "?" for i in ids.tolist())


def windows(ids: torch.Tensor, block_size: int, stride: int) -> TensorDataset:
    """Windows of `block_size` characters every `stride` characters as inputs; targets are shifted by one."""
    w = ids.unfold(0, block_size + 1, stride)  # (n, block_size + 1) views, overlapping when stride < block_size
    return TensorDataset(w[:, :-1], w[:, 1:])


class DocsText(DataModule):
    """Every docs/*.md file, concatenated in name order; the last `val_fraction` of the characters is validation."""

    def __init__(self, block_size: int = 128, batch_size: int = 32, val_fraction: float = 0.1) -> None:
        super().__init__()
        self.block_size, self.batch_size, self.val_fraction = block_size, batch_size, val_fraction

    def setup(self, stage: str) -> None:
        ids = encode("\n\n".join(p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md"))))
        split = int(len(ids) * (1 - self.val_fraction))
        # Training windows overlap (4x the samples per epoch); validation ones do not (each character counts once).
        self.train_set = windows(ids[:split], self.block_size, max(self.block_size // 4, 1))
        self.val_set = windows(ids[split:], self.block_size, self.block_size)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.batch_size)


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.head_dim, self.dropout = n_head, n_embd // n_head, dropout
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        # q, k and v apart (not one fused Linear): tensor parallelism splits each by output rows, i.e. by heads
        self.q, self.k, self.v = (nn.Linear(n_embd, n_embd) for _ in range(3))
        self.proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd),
                                 nn.Dropout(dropout))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1: the heads this rank holds (all of them, or n_head / tensor-parallel size)
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))  # (b, h, t, d)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return F.dropout(self.proj(y.transpose(1, 2).reshape(b, t, -1)), self.dropout, self.training)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPTModule(TrainModule):
    """Token and position embeddings, `n_layer` blocks, a final LayerNorm and a linear head over the characters."""

    def __init__(self, block_size: int = 128, n_layer: int = 4, n_head: int = 4, n_embd: int = 128,
                 dropout: float = 0.1, lr: float = 1e-3, weight_decay: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tok_emb, self.pos_emb = nn.Embedding(VOCAB_SIZE, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*(Block(n_embd, n_head, dropout) for _ in range(n_layer)))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, VOCAB_SIZE, bias=False)  # not tied to tok_emb: FSDP2 shards each on its own
        self.parallelized = False  # configure_model runs at every fit; it parallelizes once

    def configure_model(self) -> None:
        """Under `strategy="model_parallel"` (a device mesh): split each block's heads (q, k, v by output rows, proj
        by input columns) and its MLP over the "tensor_parallel" ranks, and shard each block over the
        "data_parallel" ones (FSDP2); the embeddings and the head stay whole. Nothing under other strategies."""
        mesh = self.device_mesh
        if mesh is None or self.parallelized:
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
        if self.hparams.n_head % tp.size():
            raise ValueError(f"n_head={self.hparams.n_head} does not split over {tp.size()} tensor-parallel ranks")
        plan = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "proj": RowwiseParallel(),
                "mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}
        for block in self.blocks:
            if tp.size() > 1:
                parallelize_module(block, tp, plan)
            if dp.size() > 1:
                fully_shard(block, mesh=dp)
        self.parallelized = True

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = F.dropout(self.tok_emb(idx) + self.pos_emb(pos), self.hparams.dropout, self.training)
        return self.head(self.ln_f(self.blocks(x)))

    def _loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten())

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self._loss(batch), prog_bar=True, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # Weight decay on the matrices (Linear and Embedding weights) only, not on biases or LayerNorm gains.
        params = list(self.parameters())
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": self.hparams.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=self.hparams.lr, betas=(0.9, 0.95))

    @torch.no_grad()
    def generate(self, prompt: str, n_chars: int, temperature: float = 0.8, seed: int = 0) -> str:
        """Sample `n_chars` characters after `prompt`, reproducibly for a given seed."""
        gen = torch.Generator().manual_seed(seed)
        self.eval()
        idx = encode(prompt).unsqueeze(0).to(self.device)
        for _ in range(n_chars):
            logits = self(idx[:, -self.hparams.block_size:])[0, -1].float().cpu()
            nxt = torch.multinomial(F.softmax(logits / temperature, dim=-1), 1, generator=gen)
            idx = torch.cat([idx, nxt.to(idx.device).unsqueeze(0)], dim=1)
        return decode(idx[0].cpu())


class SaveWeights(Callback):
    """`save_checkpoint` when training ends, inside every rank (with ddp_spawn the ranks are other processes)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        trainer.save_checkpoint(self.path, weights_only=True)  # zero3: gathers the shards; rank 0 writes


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategy", default="auto",
                   help='"auto", "single", "ddp", "ddp_spawn", "zero1", "zero2", "zero3", "model_parallel"')
    p.add_argument("--data-parallel", type=int, default=1,
                   help="with --strategy model_parallel: data-parallel size (the rest of the devices split layers)")
    p.add_argument("--devices", default="1", help='a count, or "auto"')
    p.add_argument("--accelerator", default="auto", help='"auto", "cpu", "gpu", ...')
    p.add_argument("--precision", default="32-true", help='"32-true", "bf16-mixed", "bf16-true", "16-mixed", ...')
    p.add_argument("--max-epochs", type=int, default=3)
    p.add_argument("--fast-dev-run", action="store_true", help="one batch of each loop; no logs or checkpoints")
    p.add_argument("--block-size", type=int, default=128, help="context length in characters")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--sample-chars", type=int, default=200, help="characters to sample after training")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--root", default=str(DEFAULT_ROOT), help="default_root_dir: logs and checkpoints go here")
    p.add_argument("--no-progress-bar", action="store_true")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    seed_everything(args.seed)
    model = GPTModule(args.block_size, args.n_layer, args.n_head, args.n_embd, lr=args.lr)
    data = DocsText(block_size=args.block_size, batch_size=args.batch_size)
    strategy: Any = args.strategy
    if strategy in ("zero2", "zero3"):  # shard by transformer block (FSDP's usual unit) rather than by Linear
        strategy = ZeroStrategy(stage=int(strategy[-1]), shard_modules=(Block,))
    elif strategy == "model_parallel":  # one weights file at the end (a folder of shards by default)
        strategy = ModelParallelStrategy(data_parallel_size=args.data_parallel, save_distributed_checkpoint=False)
    path = Path(args.root) / "final-weights.ckpt"
    trainer = Trainer(
        strategy=strategy, devices=int(args.devices) if args.devices.isdigit() else args.devices,
        accelerator=args.accelerator, precision=args.precision, max_epochs=args.max_epochs,
        fast_dev_run=args.fast_dev_run, gradient_clip_val=1.0, default_root_dir=args.root,
        enable_progress_bar=not args.no_progress_bar, callbacks=[SaveWeights(path)],
    )
    trainer.fit(model, datamodule=data)
    if trainer.is_global_zero:
        print(f"strategy: {trainer.strategy!r}")
        print(f"final metrics: { {k: round(float(v), 4) for k, v in trainer.callback_metrics.items()} }")
        text = GPTModule.load_from_checkpoint(path).generate("The Trainer ", args.sample_chars)
        print(f"weights: {path}\n--- sample ---\n{text}\n--------------")


if __name__ == "__main__":
    main()
