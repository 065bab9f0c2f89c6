"""The hooks around the optimizer step, in order and with their arguments, compared with Lightning 2.x itself: the same
tiny module runs under both Trainers with a recorder in every hook. Skipped where Lightning is not installed."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.helpers.boring import QUIET, regression_data
from trainer import Trainer, TrainModule

pl = pytest.importorskip("lightning.pytorch")

RECORDED = ("on_train_batch_start", "training_step", "on_before_zero_grad", "optimizer_zero_grad",
            "on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step",
            "configure_gradient_clipping", "optimizer_step", "lr_scheduler_step", "on_train_batch_end")
_WITH_INDICES = {"optimizer_step": slice(0, 2), "optimizer_zero_grad": slice(0, 2), "on_train_batch_start": slice(1, 2),
                 "training_step": slice(1, 2), "on_train_batch_end": slice(2, 3)}


def _recording(base: type, optimizer: str) -> type:
    """A module class on `base` (ours or Lightning's) whose hooks append (name, indices) to `self.calls`."""

    class Module(base):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 1)
            self.calls: list[tuple] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x)

        def configure_optimizers(self) -> Any:
            if optimizer == "lbfgs":
                return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=3)
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1),
                                                        "interval": "step"}}

    def make(name: str) -> Any:
        parent = getattr(base, name, None)

        def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
            picked = _WITH_INDICES.get(name)
            self.calls.append((name, *(args[picked] if picked else ())))
            if name == "training_step":
                x, y = args[0]
                return nn.functional.mse_loss(self(x), y)
            out = parent(self, *args, **kwargs) if parent is not None else None
            if name == "optimizer_step":
                self.calls.append(("optimizer_step returned",))
            return out

        return hook

    for name in RECORDED:
        setattr(Module, name, make(name))
    return Module


def _run(trainer_cls: type, base: type, optimizer: str, **flags: Any) -> list[tuple]:
    torch.manual_seed(0)
    model = _recording(base, optimizer)()
    loader = DataLoader(regression_data(n=40, features=8), batch_size=8)
    trainer_cls(max_epochs=2, num_sanity_val_steps=0, limit_val_batches=0, **QUIET, **flags).fit(model, loader)
    return model.calls


@pytest.mark.parametrize(("optimizer", "flags"), [
    ("sgd", {}),
    ("sgd", {"accumulate_grad_batches": 2}),
    ("sgd", {"accumulate_grad_batches": 3, "gradient_clip_val": 0.5}),
    ("lbfgs", {}),
])
def test_the_hooks_around_the_step_run_as_in_lightning(optimizer: str, flags: dict[str, Any]):
    ours = _run(Trainer, TrainModule, optimizer, **flags)
    theirs = _run(pl.Trainer, pl.LightningModule, optimizer, **flags)
    assert ours == theirs
    names = {c[0] for c in ours}
    assert {"optimizer_step", "optimizer_zero_grad", "backward", "configure_gradient_clipping"} <= names


def _warm_up(base: type) -> Any:
    """The warm-up of Lightning's docs, on `base`; the same initial weights for both (seeded)."""

    class WarmUp(base):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=0.05)

        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any) -> None:
            optimizer.step(closure=optimizer_closure)
            if self.trainer.global_step < 6:
                for group in optimizer.param_groups:
                    group["lr"] = min(1.0, (self.trainer.global_step + 1) / 6) * 0.05

    return WarmUp()


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_warm_up_override_trains_as_under_lightning(accumulate: int):
    weights = []
    for trainer_cls, base in ((Trainer, TrainModule), (pl.Trainer, pl.LightningModule)):
        model = _warm_up(base)
        loader = DataLoader(regression_data(n=64, features=8), batch_size=8)
        trainer_cls(max_epochs=2, num_sanity_val_steps=0, limit_val_batches=0, accumulate_grad_batches=accumulate,
                    **QUIET).fit(model, loader)
        weights.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    ours, theirs = weights
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert not torch.equal(ours["net.0.weight"], _warm_up(TrainModule).state_dict()["net.0.weight"])
