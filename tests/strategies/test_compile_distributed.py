"""`fit(torch.compile(module))` on 2 gloo CPU ranks: DDP (inductor) and ZeRO stages 1-3 (AOT autograd) end with the
weights of the same run uncompiled, and compile a bounded number of graphs, not one per step."""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from strategies import ZeroStrategy
from tests.helpers.boring import QUIET, regression_data
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule, seed_everything

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(240)]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x)))


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.blocks, self.out = nn.Linear(32, 16), nn.Sequential(Block(), Block()), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(torch.relu(self.inp(x))))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def _strategy(name: str) -> Any:
    return ZeroStrategy(stage=int(name[-1]), shard_modules=(Block,)) if name in ("zero2", "zero3") else name


def _fit(strategy: str, backend: str | None) -> tuple[dict[str, torch.Tensor], int]:
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()  # count this run's graphs only: dynamo's cache is per function, shared by every run
    seed_everything(0)
    module = Net()
    counter = CompileCounterWithBackend(backend) if backend else None
    trainer = Trainer(**{**QUIET, "devices": 2, "strategy": _strategy(strategy), "max_epochs": 2,
                         "val_check_interval": 0.5})
    data = regression_data(n=64)
    trainer.fit(torch.compile(module, backend=counter) if counter else module, DataLoader(data, batch_size=8),
                DataLoader(data, batch_size=8))
    state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in module.state_dict().items()}
    return {k: v.detach().clone() for k, v in state.items()}, counter.frame_count if counter else 0


def _rank(rank: int, strategies: tuple[str, ...], backend: str) -> dict[str, Any]:
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1  # this forked rank compiles in-process: starting a worker pool costs ~10 s
    return {name: (_fit(name, None)[0], *_fit(name, backend)) for name in strategies}


def _check(results: list[dict[str, Any]], max_graphs: int) -> None:
    for rank_result in results:
        for name, (eager, compiled, graphs) in rank_result.items():
            assert 0 < graphs <= max_graphs, f"{name}: {graphs} graphs"
            for key, value in eager.items():
                torch.testing.assert_close(compiled[key], value, rtol=1e-4, atol=1e-5, msg=f"{name} {key}")


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="inductor on CPU needs a C++ compiler")
def test_ddp_compiled_with_inductor_matches_eager():
    # one graph for training and one for validation (DDP splits a graph at its buckets: one bucket here)
    _check(run_distributed(_rank, ("ddp",), "inductor", timeout=200), max_graphs=2)


def test_zero_stages_compiled_match_eager():
    # zero2/3: FSDP2's hooks run between graphs, so each mode compiles the block (shared by both blocks) and the
    # module's own forward in two pieces around the blocks: 3 graphs per mode
    _check(run_distributed(_rank, ("zero1", "zero2", "zero3"), "aot_eager", timeout=200), max_graphs=6)
