"""A tiny causal transformer for the ModelParallelStrategy tests: its layers are built in `configure_model`, and,
when the strategy gives a device mesh, parallelized there the way Lightning's users do it (ColwiseParallel /
RowwiseParallel over "tensor_parallel", `fully_shard` per block over "data_parallel", each only when that dimension
has more than one rank). Without a mesh (one plain device) the same class builds the plain model: the reference."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer import TrainModule

VOCAB, WIDTH, HEADS, LAYERS, SEQ = 32, 16, 4, 2, 8


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.head_dim = width // heads
        # no biases: a key bias has no gradient in exact arithmetic (softmax ignores a shift shared by all keys), and
        # Adam turns the rounding noise left in its place into full-size steps of either sign
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds width / tp of q, k and v, i.e. heads / tp whole heads
        q, k, v = (p(x).view(b, t, -1, self.head_dim).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.w1, self.w2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.w2(F.gelu(self.w1(self.ln2(x))))


def tensor_parallel_plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(), "w1": ColwiseParallel(), "w2": RowwiseParallel()}


class TinyTransformer(TrainModule):
    """Logs, summed over the data-parallel ranks, the number of samples of each step; records its losses, the
    batches it saw and the dtype of its logits. `optimizer`: "sgd" (momentum; sensitive to every gradient's scale,
    for parity) or "adamw"."""

    def __init__(self, optimizer: str = "sgd") -> None:
        super().__init__()
        self.optimizer = optimizer
        self.model: nn.ModuleDict | None = None
        self.losses: list[torch.Tensor] = []
        self.batch_sums: list[int] = []  # sum of the token ids of each batch this rank saw
        self.logit_dtypes: set[torch.dtype] = set()

    def configure_model(self) -> None:
        if self.model is not None:
            return
        self.model = nn.ModuleDict({"emb": nn.Embedding(VOCAB, WIDTH),
                                    "blocks": nn.ModuleList(Block(WIDTH, HEADS) for _ in range(LAYERS)),
                                    "ln_f": nn.LayerNorm(WIDTH), "head": nn.Linear(WIDTH, VOCAB)})
        mesh = self.device_mesh
        if mesh is None:
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module

        tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
        for block in self.model["blocks"]:
            if tp.size() > 1:
                parallelize_module(block, tp, tensor_parallel_plan())
            if dp.size() > 1:
                fully_shard(block, mesh=dp)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        assert self.model is not None
        x = self.model["emb"](idx)
        for block in self.model["blocks"]:
            x = block(x)
        logits = self.model["head"](self.model["ln_f"](x))
        self.logit_dtypes.add(logits.dtype)
        return logits

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x).flatten(0, 1), y.flatten())
        self.losses.append(loss.detach().clone())
        self.batch_sums.append(int(x.sum()))
        self.log("samples", float(x.shape[0]), sync_dist=True, reduce_fx="sum")
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x).flatten(0, 1), y.flatten()), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.5, momentum=0.9)
        return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.01)


def token_data(n: int = 64, seed: int = 0) -> TensorDataset:
    tokens = torch.randint(0, VOCAB, (n, SEQ + 1), generator=torch.Generator().manual_seed(seed))
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def loader(batch_size: int, n: int = 64, shuffle: bool = False) -> DataLoader:
    return DataLoader(token_data(n), batch_size=batch_size, shuffle=shuffle)


def full_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's weights as whole plain tensors (collective where they are DTensors)."""
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in module.state_dict().items()}
