"""An overridden `optimizer_step` (a learning-rate warm-up) under DDP and ZeRO-1 on 2 CPU ranks with gloo trains as
one process on the 2x batch: the closure's backward is the one DDP syncs, and the per-step agreement stays inside it.
Under ZeRO-1 the optimizer the override gets is still an instance of the user's class (the strategy steps torch's
ZeroRedundancyOptimizer behind it)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.helpers.boring import QUIET, regression_data
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule, seed_everything

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(120)]


class WarmUpRegression(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))
        self.steps_seen: list[int] = []
        self.optimizer_classes: set[str] = set()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any) -> None:
        self.steps_seen.append(self.trainer.global_step)
        self.optimizer_classes.add("SGD" if isinstance(optimizer, torch.optim.SGD) else type(optimizer).__name__)
        optimizer.step(closure=optimizer_closure)
        if self.trainer.global_step < 8:
            for group in optimizer.param_groups:
                group["lr"] = min(1.0, (self.trainer.global_step + 1) / 8) * 0.05


def _fit(batch_size: int, accumulate: int, **flags: Any) -> tuple[dict[str, torch.Tensor], list[int], set[str]]:
    seed_everything(0)
    model = WarmUpRegression()
    loader = DataLoader(regression_data(n=320), batch_size=batch_size)
    Trainer(max_steps=12, accumulate_grad_batches=accumulate, **{**QUIET, **flags}).fit(model, loader)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, model.steps_seen, model.optimizer_classes


def _rank(rank: int, accumulate: int, strategy: str) -> tuple[dict[str, torch.Tensor], list[int], set[str]]:
    return _fit(4, accumulate, devices=2, strategy=strategy)


@pytest.mark.parametrize(("strategy", "accumulate"), [("ddp", 1), ("ddp", 2), ("zero1", 1)])
def test_a_warm_up_override_on_two_ranks_matches_one_process_on_the_double_batch(strategy: str, accumulate: int):
    ranks = run_distributed(_rank, accumulate, strategy)
    single, steps, _ = _fit(8, accumulate)
    assert steps == list(range(12)) and ranks[0][1] == ranks[1][1] == steps
    assert ranks[0][2] == ranks[1][2] == {"SGD"}
    for key in single:
        assert torch.equal(ranks[0][0][key], ranks[1][0][key]), f"ranks disagree on {key}"
        torch.testing.assert_close(ranks[0][0][key], single[key], rtol=1e-5, atol=1e-6)
