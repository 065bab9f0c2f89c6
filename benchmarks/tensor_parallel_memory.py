"""Tensor parallelism's memory per rank: parameters and activations on 4 CPU ranks, 1x4 vs 2x2 vs 4x1 vs zero3.

One module, built in `configure_model` (on the meta device, materialised shard by shard): `layers` residual blocks
`x + w2(gelu(w1(ln(x))))` of width `d` (w1: d -> 4d, w2: 4d -> d), then a LayerNorm and a Linear(d, d) head, on
inputs (batch, seq, d) with an MSE loss; SGD. Four runs on 4 forked gloo ranks, one global batch:

- `ModelParallelStrategy(dp, tp)` for the meshes (data_parallel x tensor_parallel) 1x4, 2x2 and 4x1: with tp > 1
  `configure_model` applies ColwiseParallel to w1 and RowwiseParallel to w2 of every block; with dp > 1 it shards
  every block with `fully_shard` over "data_parallel" (the strategy's root unit takes the rest);
- `zero3` (`ZeroStrategy(stage=3, shard_modules=(Block,))`): FSDP2 over all 4 ranks, one unit per block.

What is measured, per rank, counting each storage once (a DTensor: its local shard):

- params at rest: the bytes of the module's parameters after the optimizer step;
- params peak: the most parameter bytes registered on the module at any block's forward (FSDP2 swaps the gathered
  parameters in for a unit's forward: this is its all-gather peak; a tensor-parallel layer never gathers);
- activations: the bytes autograd keeps for backward from inside the blocks (torch's saved-tensor hooks, the
  parameters it saves excluded), at the end of forward.

The formula each is compared with (fp32, 4 bytes; P_tp: the parameters tensor parallelism splits, w1's weight and
bias and w2's weight; P_rest: the others; a block's parameters P_b = P_b,tp + P_b,rest):

    params at rest   = 4 (P_tp / (dp tp) + P_rest / dp)                     (zero3: 4 P / 4)
    params peak      = at rest + 4 (1 - 1/dp) (P_root + P_b,tp / tp + P_b,rest)  (the root unit stays gathered
                       through forward, one block at a time is gathered on top; zero3: dp = 4, tp = 1)
    activations      = 4 layers (batch / dp) seq (2 d + 8 d / tp + 2)           (per block: its input and ln's
                       output, w1's and gelu's outputs split over tp, ln's mean and rstd)

    .venv/bin/python benchmarks/tensor_parallel_memory.py            # d=1024, 4 layers, batch 8 x 128 (about 2 min)
    .venv/bin/python benchmarks/tensor_parallel_memory.py --quick    # d=256, 2 layers, batch 8 x 32 (< 1 min)
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from common import figure, machine_info, write_result
from forked_ranks import run_forked
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from strategies import ModelParallelStrategy, ZeroStrategy
from trainer import Trainer, TrainModule

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "tensor_parallel_memory.json"
WORLD_SIZE = 4
MiB = 2**20
LAYOUTS = {"1x4": (1, 4), "2x2": (2, 2), "4x1": (4, 1), "zero3": (4, 1)}
TP_SPLIT = ("w1.weight", "w1.bias", "w2.weight")  # what ColwiseParallel(w1) / RowwiseParallel(w2) split


@dataclass
class Config:
    width: int = 1024
    layers: int = 4
    batch: int = 8  # global
    seq: int = 128
    steps: int = 2
    timeout: float = 600.0


QUICK = Config(width=256, layers=2, seq=32, timeout=300.0)


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln, self.w1, self.w2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.w2(F.gelu(self.w1(self.ln(x))))


class WideMLP(TrainModule):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.blocks: nn.ModuleList | None = None

    def configure_model(self) -> None:
        if self.blocks is not None:
            return
        d = self.cfg.width
        self.blocks = nn.ModuleList(Block(d) for _ in range(self.cfg.layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, d)
        mesh = self.device_mesh
        if mesh is None:  # zero3: the strategy shards
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        tp, dp = mesh["tensor_parallel"], mesh["data_parallel"]
        for block in self.blocks:
            if tp.size() > 1:
                parallelize_module(block, tp, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
            if dp.size() > 1:
                fully_shard(block, mesh=dp)

    def forward(self, x: Tensor) -> Tensor:
        assert self.blocks is not None
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return F.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def storage_bytes(tensors: Any, skip: set[int] | None = None) -> tuple[int, set[int]]:
    """(bytes, storage pointers) of `tensors`, each storage once (a DTensor: its local shard)."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        if storage.data_ptr() not in (skip or set()):
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(seen.values()), set(seen)


class Probe(Callback):
    """Parameter bytes at rest and at every block's forward; bytes saved for backward inside the blocks."""

    def __init__(self) -> None:
        self.params_at_rest = self.params_peak = self.activations = 0
        self._module: Any = None
        self._inside = 0
        self._saved: dict[int, int] = {}
        self._hooks: list[Any] = []
        self._saving: Any = None

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self._module = module
        for block in module.blocks:
            self._hooks.append(block.register_forward_pre_hook(self._enter))
            self._hooks.append(block.register_forward_hook(self._leave))

    def _enter(self, block: nn.Module, args: Any) -> None:
        self._inside += 1
        self.params_peak = max(self.params_peak, storage_bytes(self._module.parameters())[0])

    def _leave(self, block: nn.Module, args: Any, output: Any) -> None:
        self._inside -= 1

    def _pack(self, tensor: Tensor) -> Tensor:
        if self._inside:
            params = storage_bytes(self._module.parameters())[1]
            size, ptrs = storage_bytes([tensor], skip=params)
            for ptr in ptrs:
                self._saved[ptr] = size
        return tensor

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self._saved = {}
        self._saving = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._saving.__enter__()

    def on_before_backward(self, trainer: Any, module: Any, loss: Tensor) -> None:
        self._saving.__exit__(None, None, None)
        self.activations = max(self.activations, sum(self._saved.values()))

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.params_at_rest = storage_bytes(module.parameters())[0]

    def on_train_end(self, trainer: Any, module: Any) -> None:
        for hook in self._hooks:
            hook.remove()


def data(cfg: Config) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    n = cfg.batch * cfg.steps
    return TensorDataset(torch.randn(n, cfg.seq, cfg.width, generator=gen),
                         torch.randn(n, cfg.seq, cfg.width, generator=gen))


def run_rank(rank: int, cfg: Config) -> dict[str, dict[str, int]]:
    out = {}
    for name, (dp, tp) in LAYOUTS.items():
        strategy: Any = (ZeroStrategy(stage=3, shard_modules=(Block,)) if name == "zero3"
                         else ModelParallelStrategy(dp, tp))
        probe = Probe()
        trainer = Trainer(strategy=strategy, accelerator="cpu", devices=WORLD_SIZE, max_steps=cfg.steps,
                          callbacks=[probe], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False)
        torch.manual_seed(0)
        trainer.fit(WideMLP(cfg), DataLoader(data(cfg), batch_size=cfg.batch // dp))
        out[name] = {"params_at_rest": probe.params_at_rest, "params_peak": probe.params_peak,
                     "activations": probe.activations}
    return out


def formula(cfg: Config, name: str) -> dict[str, float]:
    """The bytes per rank the module docstring's formulas give."""
    dp, tp = LAYOUTS[name]
    d, layers = cfg.width, cfg.layers
    block_tp, block_rest = 8 * d * d + 4 * d, 3 * d  # w1 weight+bias, w2 weight | w2 bias, ln weight+bias
    root = 2 * d + d * d + d  # ln_f, head
    p_tp, p_rest = layers * block_tp, layers * block_rest + root
    at_rest = 4 * (p_tp / (dp * tp) + p_rest / dp)
    gathered = 4 * (1 - 1 / dp) * (root + block_tp / tp + block_rest)
    activations = 4 * layers * (cfg.batch / dp) * cfg.seq * (2 * d + 8 * d / tp + 2)
    return {"params_at_rest": at_rest, "params_peak": at_rest + gathered, "activations": activations}


def summarize(ranks: list[dict[str, dict[str, int]]], cfg: Config) -> dict[str, Any]:
    """Per layout: the larger rank's bytes, the formula's, and their ratio."""
    summary: dict[str, Any] = {}
    for name in LAYOUTS:
        measured = {key: max(r[name][key] for r in ranks) for key in ("params_at_rest", "params_peak", "activations")}
        expected = formula(cfg, name)
        summary[name] = {"measured": measured, "formula": expected,
                         "per_rank": [r[name] for r in ranks],
                         "ratio": {k: measured[k] / expected[k] for k in measured}}
    return summary


def markdown_table(summary: dict[str, Any]) -> str:
    head = ("| layout (dp x tp) | params at rest MiB (formula) | params peak MiB (formula) "
            "| activations MiB (formula) | params + activations peak MiB |")
    lines = [head, "|---|---:|---:|---:|---:|"]
    for name, row in summary.items():
        m, f = row["measured"], row["formula"]
        cells = [f"{m[k] / MiB:.2f} ({f[k] / MiB:.2f})" for k in ("params_at_rest", "params_peak", "activations")]
        lines.append(f"| {name} | {' | '.join(cells)} | {(m['params_peak'] + m['activations']) / MiB:.2f} |")
    return "\n".join(lines)


def figures(summary: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, row in summary.items():
        for key, label in (("params_peak", "params peak per rank"), ("activations", "activations per rank")):
            out.append(figure(f"{name}_{key}", f"{name}: {label}", [row["measured"][key] / MiB], "MiB",
                              role="baseline" if name == "zero3" else "ours",
                              note=f"formula {row['formula'][key] / MiB:.2f} MiB"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="d=256, 2 layers, sequences of 32")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default: {DEFAULT_OUT})")
    args = parser.parse_args()
    cfg = QUICK if args.quick else Config()
    torch.set_num_threads(1)
    started = time.perf_counter()
    ranks = run_forked(lambda rank: run_rank(rank, cfg), "tensor_parallel_memory", WORLD_SIZE, cfg.timeout)
    summary = summarize(ranks, cfg)
    table = markdown_table(summary)
    print(table)
    elapsed = time.perf_counter() - started
    write_result(args.out, "tensor_parallel_memory", figures(summary), mode="quick" if args.quick else "full",
                 config=asdict(cfg), elapsed_s=elapsed, machine=machine_info(), world_size=WORLD_SIZE,
                 summary=summary, table_markdown=table)
    print(f"({elapsed:.0f} s)")


if __name__ == "__main__":
    main()
