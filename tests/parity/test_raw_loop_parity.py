"""The Trainer on CPU equals a hand-written torch loop bit for bit (same seed, data and shuffling).

The loader shuffles either from the global torch RNG or from its own seeded generator; either way the
Trainer draws each epoch's order exactly as the raw loop's `for batch in loader` does, epoch after epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.helpers.boring import QUIET, regression_data
from trainer import Trainer, TrainModule, seed_everything

EPOCHS, ACCUMULATE, CLIP = 3, 2, 1.0


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))


def _sgd(params: Any) -> tuple[torch.optim.Optimizer, Any]:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9), None


def _adamw_steplr(params: Any) -> tuple[torch.optim.Optimizer, Any]:
    opt = torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


def _loader(generator: bool = False) -> DataLoader:
    # 72 samples / batch 8 = 9 full batches: the last accumulation window of each epoch is incomplete, and
    # the epoch's order is used up exactly at its last batch (where an epoch ends is what a generator sees).
    return DataLoader(regression_data(n=72), batch_size=8, shuffle=True,
                      generator=torch.Generator().manual_seed(1) if generator else None)


def raw_loop(make_opt: Callable, generator: bool = False) -> dict[str, torch.Tensor]:
    seed_everything(7)
    net = _net()
    opt, sched = make_opt(net.parameters())
    loader = _loader(generator)
    for _ in range(EPOCHS):
        batches = len(loader)
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(net(x), y)
            (loss / ACCUMULATE).backward()
            if (i + 1) % ACCUMULATE == 0 or i + 1 == batches:
                torch.nn.utils.clip_grad_norm_(list(net.parameters()), CLIP)
                opt.step()
                opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()
    return {k: v.clone() for k, v in net.state_dict().items()}


class ParityModule(TrainModule):
    def __init__(self, make_opt: Callable) -> None:
        super().__init__()
        self.net = _net()
        self.make_opt = make_opt

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        opt, sched = self.make_opt(self.parameters())
        return opt if sched is None else {"optimizer": opt, "lr_scheduler": sched}


def trainer_run(make_opt: Callable, generator: bool = False) -> dict[str, torch.Tensor]:
    seed_everything(7)
    model = ParityModule(make_opt)
    loader = _loader(generator)
    trainer = Trainer(max_epochs=EPOCHS, accumulate_grad_batches=ACCUMULATE, gradient_clip_val=CLIP, **QUIET)
    trainer.fit(model, loader)
    assert trainer.global_step == EPOCHS * 5  # ceil(9 / 2) optimizer steps per epoch
    return {k.removeprefix("net."): v for k, v in model.state_dict().items()}


@pytest.mark.parametrize("generator", [False, True], ids=["global_rng_shuffle", "generator_shuffle"])
@pytest.mark.parametrize("make_opt", [_sgd, _adamw_steplr], ids=["sgd_momentum", "adamw_steplr"])
def test_trainer_matches_raw_loop_bit_for_bit(make_opt: Callable, generator: bool):
    expected = raw_loop(make_opt, generator)
    got = trainer_run(make_opt, generator)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key


def test_epochs_of_a_generator_shuffled_loader_have_different_orders():
    """The generator case above is not trivially equal: each epoch draws a new order from the generator."""
    loader = _loader(generator=True)
    first, second = (torch.cat([x for x, _ in loader]) for _ in range(2))
    assert not torch.equal(first, second)


def test_parity_is_sensitive_to_a_one_step_difference():
    """The comparison above can fail: one extra optimizer step changes the weights."""
    expected = raw_loop(_sgd)
    seed_everything(7)
    model = ParityModule(_sgd)
    Trainer(max_epochs=EPOCHS, max_steps=EPOCHS * 5 - 1, accumulate_grad_batches=ACCUMULATE, gradient_clip_val=CLIP,
            **QUIET).fit(model, _loader())
    got = {k.removeprefix("net."): v for k, v in model.state_dict().items()}
    assert not all(torch.equal(expected[k], got[k]) for k in expected)
