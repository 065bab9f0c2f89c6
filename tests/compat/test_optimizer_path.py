"""The overridable optimizer path, as Lightning 2.x documents it: `optimizer_step` with its closure,
`optimizer_zero_grad`, `backward`, `manual_backward` arguments, and closure optimizers (LBFGS). Each override is
checked for Lightning's arguments at Lightning's moment, and the numbers against the equivalent raw torch loop.
Clipping and scheduler hooks: test_optimizer_hooks.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from strategies.exceptions import ConfigError, MisconfigurationError
from tests.helpers.boring import QUIET, regression_data
from trainer import Trainer, TrainModule, seed_everything

FLAGS = {**QUIET, "num_sanity_val_steps": 0, "limit_val_batches": 0}


class Regression(TrainModule):
    """A small regression with SGD (momentum) that records what its hooks receive."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 8), nn.Tanh(), nn.Linear(8, 1))
        self.lr = lr
        self.calls: list[tuple] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.calls.append(("training_step", batch_idx))
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def _loader(n: int = 48, batch_size: int = 8) -> DataLoader:
    return DataLoader(regression_data(n=n), batch_size=batch_size)


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _raw_loop(model: Regression, epochs: int, accumulate: int = 1, after_step: Any = None) -> dict[str, torch.Tensor]:
    """The raw torch loop the Trainer must equal: zero_grad at a window's start, loss / accumulate, step at its end."""
    opt = model.configure_optimizers()
    loader, step = _loader(), 0
    for _ in range(epochs):
        for i, (x, y) in enumerate(loader):
            if i % accumulate == 0:
                opt.zero_grad()
            (nn.functional.mse_loss(model.net(x), y) / accumulate).backward()
            if (i + 1) % accumulate == 0 or i == len(loader) - 1:
                opt.step()
                if after_step is not None:
                    after_step(opt, step)
                step += 1
    return _weights(model)


# --- optimizer_step ---------------------------------------------------------------------------------------
class WarmUp(Regression):
    """The learning-rate warm-up of Lightning's docs: step, then scale the lr by the steps taken."""

    warmup = 5

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any) -> None:
        self.calls.append(("optimizer_step", epoch, batch_idx, optimizer, optimizer_closure))
        optimizer.step(closure=optimizer_closure)
        if self.trainer.global_step < self.warmup:
            scale = min(1.0, float(self.trainer.global_step + 1) / self.warmup)
            for group in optimizer.param_groups:
                group["lr"] = scale * self.lr


def test_the_warm_up_override_trains_as_the_raw_loop():
    seed_everything(0)
    model = WarmUp()
    raw = WarmUp()
    raw.load_state_dict(model.state_dict())
    Trainer(max_epochs=2, **FLAGS).fit(model, _loader())

    def warm(opt: torch.optim.Optimizer, step: int) -> None:
        if step < WarmUp.warmup:
            for group in opt.param_groups:
                group["lr"] = min(1.0, float(step + 1) / WarmUp.warmup) * raw.lr

    expected = _raw_loop(raw, epochs=2, after_step=warm)
    got = _weights(model)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert not torch.equal(got["net.0.weight"], WarmUp().state_dict()["net.0.weight"])


def test_optimizer_step_gets_lightnings_arguments_on_every_batch():
    model = WarmUp()
    trainer = Trainer(max_epochs=2, **FLAGS)
    trainer.fit(model, _loader())
    steps = [c for c in model.calls if c[0] == "optimizer_step"]
    assert [(c[1], c[2]) for c in steps] == [(e, b) for e in range(2) for b in range(6)]
    optimizer = steps[0][3]
    assert isinstance(optimizer, torch.optim.SGD) and optimizer is model.optimizers()
    assert all(callable(c[4]) for c in steps)
    # the closure runs training_step inside optimizer_step: each step's training_step follows its optimizer_step
    names = [c[0] for c in model.calls]
    assert names[:4] == ["optimizer_step", "training_step", "optimizer_step", "training_step"]
    assert trainer.global_step == 12


def test_the_closure_returns_the_loss_and_the_step_returns_what_the_closure_returned():
    seen: list[Any] = []

    class Model(Regression):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any) -> None:
            seen.append(optimizer.step(closure=optimizer_closure))

    Trainer(max_epochs=1, limit_train_batches=2, **FLAGS).fit(Model(), _loader())
    assert len(seen) == 2 and all(isinstance(v, torch.Tensor) and v.ndim == 0 and not v.requires_grad for v in seen)


def test_on_train_batch_end_gets_the_loss_tensor_the_closure_returned():
    """As in Lightning 2.6 (checked side by side): outputs["loss"] is the detached loss the closure returned, the same
    tensor, not a second detach of it."""
    returned: list[Any] = []
    received: list[Any] = []

    class Model(Regression):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any) -> None:
            returned.append(optimizer.step(closure=optimizer_closure))

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            received.append(outputs["loss"])

    Trainer(max_epochs=1, limit_train_batches=2, **FLAGS).fit(Model(), _loader())
    assert len(received) == 2 and all(out is ret for out, ret in zip(received, returned, strict=True))


def test_an_override_that_never_runs_the_closure_is_refused():
    class Forgetful(Regression):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any) -> None:
            optimizer.step()  # the closure (training_step, backward) never runs

    with pytest.raises(MisconfigurationError, match="did not run its `optimizer_closure`"):
        Trainer(max_epochs=1, **FLAGS).fit(Forgetful(), _loader())


def test_an_override_may_skip_the_step_by_calling_the_closure_itself():
    class EveryOther(Regression):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any) -> None:
            if batch_idx % 2 == 0:
                optimizer.step(closure=optimizer_closure)
            else:
                optimizer_closure()  # training_step, zero_grad, backward; no step

    seed_everything(0)
    model = EveryOther()
    raw = Regression()
    raw.load_state_dict(model.state_dict())
    trainer = Trainer(max_epochs=1, **FLAGS)
    trainer.fit(model, _loader())
    assert len([c for c in model.calls if c[0] == "training_step"]) == 6
    assert trainer.global_step == 6  # every optimizer_step call counts, as in Lightning
    opt = raw.configure_optimizers()
    for i, (x, y) in enumerate(_loader()):
        opt.zero_grad()
        nn.functional.mse_loss(raw.net(x), y).backward()
        if i % 2 == 0:
            opt.step()
    got = _weights(model)
    assert all(torch.equal(got[k], v) for k, v in _weights(raw).items())


@pytest.mark.parametrize("accumulate", [2, 4])
def test_with_accumulation_only_the_window_closing_batches_call_optimizer_step(accumulate: int):
    seed_everything(0)
    model = WarmUp()
    model.warmup = 0
    raw = Regression()
    raw.load_state_dict(model.state_dict())
    Trainer(max_epochs=2, accumulate_grad_batches=accumulate, **FLAGS).fit(model, _loader())
    steps = [c[2] for c in model.calls if c[0] == "optimizer_step"]
    expected_idx = [i for i in range(6) if (i + 1) % accumulate == 0 or i == 5]
    assert steps == expected_idx * 2
    expected = _raw_loop(raw, epochs=2, accumulate=accumulate)
    got = _weights(model)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_optimizer_step_under_16_mixed_evaluates_the_closure_before_the_scaled_step():
    model = WarmUp()
    trainer = Trainer(max_epochs=1, precision="16-mixed", **FLAGS)
    trainer.fit(model, _loader())
    assert trainer.global_step == 6
    assert len([c for c in model.calls if c[0] == "training_step"]) == 6
    assert all(torch.isfinite(p).all() for p in model.parameters())


# --- closure optimizers -------------------------------------------------------------------------------------
class LeastSquares(TrainModule):
    """A convex problem: linear least squares on one full batch, solved with LBFGS."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 1)
        self.evaluations = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.evaluations += 1
        x, y = batch
        return nn.functional.mse_loss(self.linear(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.LBFGS(self.parameters(), lr=1.0, max_iter=10, history_size=10)


def _least_squares_data() -> DataLoader:
    return DataLoader(regression_data(n=64, features=8), batch_size=64)


def test_lbfgs_converges_as_in_a_raw_loop():
    seed_everything(0)
    model = LeastSquares()
    raw = LeastSquares()
    raw.load_state_dict(model.state_dict())
    trainer = Trainer(max_epochs=3, **FLAGS)
    trainer.fit(model, _least_squares_data())

    opt = raw.configure_optimizers()
    x, y = next(iter(_least_squares_data()))
    for _ in range(3):
        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(raw.linear(x), y)
            loss.backward()
            return loss

        opt.step(closure)
    for name, value in raw.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], value, rtol=0, atol=1e-6)
    assert trainer.global_step == 3
    assert model.evaluations > 3  # LBFGS evaluated the closure (training_step) several times per step
    solution = torch.linalg.lstsq(torch.cat([x, torch.ones(64, 1)], 1), y).solution
    fitted = torch.cat([model.linear.weight.detach().flatten(), model.linear.bias.detach()])
    torch.testing.assert_close(fitted, solution.flatten(), rtol=0, atol=1e-4)


def test_lbfgs_under_16_mixed_is_refused_at_fit_start():
    with pytest.raises(ConfigError, match="LBFGS"):
        Trainer(max_epochs=1, precision="16-mixed", **FLAGS).fit(LeastSquares(), _least_squares_data())


# --- optimizer_zero_grad and backward -----------------------------------------------------------------------
def test_optimizer_zero_grad_is_called_with_lightnings_arguments_at_each_window_start():
    class Model(Regression):
        def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
            self.calls.append(("zero_grad", epoch, batch_idx, optimizer))
            optimizer.zero_grad(set_to_none=False)

        def on_before_zero_grad(self, optimizer: Any) -> None:
            self.calls.append(("on_before_zero_grad",))

    model = Model()
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=2, **FLAGS)
    trainer.fit(model, _loader())
    zeros = [c for c in model.calls if c[0] == "zero_grad"]
    assert [(c[1], c[2]) for c in zeros] == [(0, 0), (0, 2), (0, 4)]
    assert all(c[3] is trainer.optimizers[0] for c in zeros)
    names = [c[0] for c in model.calls]
    assert names[:3] == ["training_step", "on_before_zero_grad", "zero_grad"]  # after training_step, before backward
    assert all(p.grad is not None for p in model.parameters())  # set_to_none=False was honoured


def test_a_backward_override_receives_the_loss_and_does_the_backward():
    received: list[torch.Tensor] = []

    class Model(Regression):
        def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            received.append(loss.detach())
            (loss * 0).backward(*args, **kwargs)  # no gradient: the weights must not move

    model = Model()
    before = _weights(model)
    Trainer(max_epochs=1, limit_train_batches=3, accumulate_grad_batches=1, **FLAGS).fit(model, _loader())
    assert len(received) == 3
    after = _weights(model)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_manual_backward_passes_its_arguments_through_to_backward():
    seen: list[dict[str, Any]] = []

    class Manual(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            seen.append(dict(kwargs))
            super().backward(loss, *args, **kwargs)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            opt = self.optimizers()
            loss = super().training_step(batch, batch_idx)
            opt.zero_grad()
            self.manual_backward(loss, retain_graph=True)
            self.manual_backward(loss)  # the graph is still there: retain_graph reached Tensor.backward
            opt.step()
            return loss.detach()

    Trainer(max_epochs=1, limit_train_batches=2, **FLAGS).fit(Manual(), _loader())
    assert seen == [{"retain_graph": True}, {}] * 2
