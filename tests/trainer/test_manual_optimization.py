"""Manual optimization: several optimizers, manual_backward, optimizer.step through the strategy."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer
from trainer.exceptions import ConfigError


class TwoOptimizers(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.other = nn.Linear(32, 2)
        self.hooks: list[str] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        opt_a, opt_b = self.optimizers()
        for opt, layer in ((opt_a, self.layer), (opt_b, self.other)):
            loss = layer(batch).pow(2).mean()
            opt.zero_grad()
            self.manual_backward(loss)
            self.clip_gradients(opt, gradient_clip_val=0.5)
            opt.step()
        self.log("loss", loss)

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.hooks.append("before_backward")

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.hooks.append("before_step")

    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.layer.parameters(), lr=0.1), torch.optim.Adam(self.other.parameters(), lr=0.1)]


def test_manual_optimization_steps_every_optimizer():
    model = TwoOptimizers()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    assert trainer.global_step == 6  # like Lightning: each optimizer.step() counts
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert model.hooks == ["before_backward", "before_step"] * 6
    assert "loss" in trainer.callback_metrics


def test_manual_optimization_rejects_gradient_accumulation_flag():
    with pytest.raises(ConfigError, match=r"accumulate_grad_batches > 1 is not supported with manual optimization"):
        Trainer(max_epochs=1, accumulate_grad_batches=2, **QUIET).fit(TwoOptimizers())
