"""`self.optimizers()` (the wrapper is an instance of the user's optimizer class and steps through the
strategy; `use_pl_optimizer=False` gives the optimizer itself) and `toggle_optimizer` / `untoggle_optimizer` /
`toggled_optimizer` in a two-optimizer GAN-style manual loop, with Lightning's semantics."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET, regression_data
from trainer import Trainer, TrainModule, seed_everything

FLAGS = {**QUIET, "num_sanity_val_steps": 0, "limit_val_batches": 0}


class TwoNets(TrainModule):
    """A generator and a discriminator sharing nothing but an embedding (held by both optimizers), stepped by hand."""

    def __init__(self, toggle: str = "none") -> None:
        super().__init__()
        self.automatic_optimization = False
        self.shared = nn.Linear(8, 8)
        self.gen = nn.Linear(8, 8)
        self.disc = nn.Linear(8, 1)
        self.frozen = nn.Linear(8, 8)  # frozen by the user before fit: toggling must leave it frozen
        self.frozen.requires_grad_(False)
        self.toggle = toggle
        self.seen: list[dict[str, Any]] = []

    def configure_optimizers(self) -> Any:
        opt_g = torch.optim.Adam([*self.shared.parameters(), *self.gen.parameters(), *self.frozen.parameters()],
                                 lr=1e-2)
        opt_d = torch.optim.SGD([*self.shared.parameters(), *self.disc.parameters()], lr=1e-2)
        return opt_g, opt_d

    def _requires_grad(self) -> dict[str, bool]:
        return {name: p.requires_grad for name, p in self.named_parameters()}

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, _ = batch
        opt_g, opt_d = self.optimizers()
        # generator step: the discriminator's parameters take no gradient while the generator's loss backpropagates
        if self.toggle == "calls":
            self.toggle_optimizer(opt_g)
        fake = self.gen(self.shared(x))
        g_loss = -self.disc(fake).mean()
        self.seen.append({"during_g": self._requires_grad()})
        opt_g.zero_grad()
        opt_d.zero_grad()
        self.manual_backward(g_loss)
        self.seen[-1]["disc_grad"] = self.disc.weight.grad
        opt_g.step()
        if self.toggle == "calls":
            self.untoggle_optimizer(opt_g)
        self.seen[-1]["after_g"] = self._requires_grad()
        # discriminator step, with the context manager
        if self.toggle == "context":
            with self.toggled_optimizer(opt_d):
                self._discriminator_step(x, fake, opt_d)
        else:
            self._discriminator_step(x, fake, opt_d)

    def _discriminator_step(self, x: torch.Tensor, fake: torch.Tensor, opt_d: Any) -> None:
        self.seen[-1]["during_d"] = self._requires_grad()
        d_loss = self.disc(fake.detach()).mean() - self.disc(self.shared(x)).mean()
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()


def _loader() -> DataLoader:
    return DataLoader(regression_data(n=32, features=8), batch_size=8)


def test_toggle_freezes_only_the_parameters_of_the_other_optimizers_and_untoggle_restores_them():
    model = TwoNets(toggle="calls")
    Trainer(max_epochs=1, limit_train_batches=2, **FLAGS).fit(model, _loader())
    during = model.seen[0]["during_g"]
    assert not during["disc.weight"] and not during["disc.bias"]  # only in the other optimizer: off
    assert during["shared.weight"] and during["gen.weight"]  # in the toggled optimizer (shared too): on
    assert not during["frozen.weight"]  # frozen before: stays frozen
    assert model.seen[0]["disc_grad"] is None  # no dangling gradient on the discriminator
    after = model.seen[0]["after_g"]
    assert after["disc.weight"] and after["shared.weight"] and not after["frozen.weight"]


def test_toggled_optimizer_is_a_context_manager_that_restores_even_on_error():
    model = TwoNets(toggle="context")
    Trainer(max_epochs=1, limit_train_batches=1, **FLAGS).fit(model, _loader())
    during_d = model.seen[0]["during_d"]
    assert during_d["disc.weight"] and during_d["shared.weight"]
    assert not during_d["gen.weight"]  # only in the generator's optimizer
    assert all(p.requires_grad for n, p in model.named_parameters() if not n.startswith("frozen"))

    class Failing(TwoNets):
        def _discriminator_step(self, x: torch.Tensor, fake: torch.Tensor, opt_d: Any) -> None:
            raise RuntimeError("boom")

    failing = Failing(toggle="context")
    with pytest.raises(RuntimeError, match="boom"):
        Trainer(max_epochs=1, limit_train_batches=1, **FLAGS).fit(failing, _loader())
    assert failing.gen.weight.requires_grad


def test_toggling_changes_the_results_of_a_gan_loop_as_in_lightning():
    """Without toggling, the generator's backward leaves gradients on the shared layer that the discriminator's
    zero_grad clears; on the discriminator, toggling keeps its `disc` gradients out of the generator's step."""
    runs = {}
    for toggle in ("none", "calls"):
        seed_everything(0)
        model = TwoNets(toggle=toggle)
        Trainer(max_epochs=1, limit_train_batches=2, **FLAGS).fit(model, _loader())
        runs[toggle] = model
    assert runs["none"].seen[0]["disc_grad"] is not None and runs["calls"].seen[0]["disc_grad"] is None


# --- the wrapper ------------------------------------------------------------------------------------------
class Recorder(TrainModule):
    def __init__(self, automatic: bool = True) -> None:
        super().__init__()
        self.automatic_optimization = automatic
        self.layer = nn.Linear(8, 1)
        self.seen: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        opt = self.optimizers()
        self.seen.append((opt, self.optimizers(use_pl_optimizer=False)))
        if not self.automatic_optimization:
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            return None
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


@pytest.mark.parametrize("automatic", [True, False])
def test_optimizers_returns_an_instance_of_the_users_optimizer_class(automatic: bool):
    model = Recorder(automatic)
    trainer = Trainer(max_epochs=1, limit_train_batches=2, **FLAGS)
    trainer.fit(model, _loader())
    wrapper, raw = model.seen[0]
    assert isinstance(wrapper, torch.optim.Optimizer) and isinstance(wrapper, torch.optim.Adam)
    assert type(raw) is torch.optim.Adam and raw is trainer.optimizers[0] and wrapper is not raw
    assert wrapper.optimizer is raw
    assert wrapper.param_groups is raw.param_groups and wrapper.state is raw.state
    assert wrapper.state_dict()["param_groups"] == raw.state_dict()["param_groups"]
    wrapper.param_groups[0]["lr"] = 0.5  # writes reach the optimizer the strategy steps
    assert raw.param_groups[0]["lr"] == 0.5
    wrapper.custom_flag = 1
    assert raw.custom_flag == 1
    assert trainer.global_step == 2


def test_the_wrapper_step_goes_through_the_strategy_and_counts_in_manual_optimization():
    stepped: list[Any] = []

    class Model(Recorder):
        def on_before_optimizer_step(self, optimizer: Any) -> None:
            stepped.append(optimizer)

    model = Model(automatic=False)
    trainer = Trainer(max_epochs=1, limit_train_batches=3, **FLAGS)
    trainer.fit(model, _loader())
    assert trainer.global_step == 3 and stepped == [trainer.optimizers[0]] * 3


def test_the_wrapper_refuses_a_closure_that_is_not_callable():
    class Model(Recorder):
        def training_step(self, batch: Any, batch_idx: int) -> None:
            self.optimizers().step(closure=1)

    with pytest.raises(MisconfigurationError, match="callable closure"):
        Trainer(max_epochs=1, limit_train_batches=1, **FLAGS).fit(Model(automatic=False), _loader())


def test_a_manual_step_with_a_closure_runs_it_before_on_before_optimizer_step():
    order: list[str] = []

    class Model(Recorder):
        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            opt = self.optimizers()

            def closure() -> torch.Tensor:
                order.append("closure")
                loss = nn.functional.mse_loss(self.layer(x), y)
                opt.zero_grad()
                self.manual_backward(loss)
                return loss

            loss = opt.step(closure=closure)
            order.append(f"returned {type(loss).__name__}")

        def on_before_optimizer_step(self, optimizer: Any) -> None:
            order.append("on_before_optimizer_step")

    Trainer(max_epochs=1, limit_train_batches=1, **FLAGS).fit(Model(automatic=False), _loader())
    assert order == ["closure", "on_before_optimizer_step", "returned Tensor"]


def test_the_wrapper_survives_pickling_and_deepcopy():
    """ddp_spawn pickles what the ranks get; the wrapper's class is built at run time and must come back."""
    import copy
    import pickle

    model = Recorder()
    Trainer(max_epochs=1, limit_train_batches=1, **FLAGS).fit(model, _loader())
    wrapper = model.seen[0][0]
    for clone in (pickle.loads(pickle.dumps(wrapper)), copy.deepcopy(wrapper)):
        assert isinstance(clone, torch.optim.Adam) and type(clone).__name__ == type(wrapper).__name__
        assert clone.param_groups[0]["lr"] == wrapper.param_groups[0]["lr"] and clone.optimizer is not wrapper.optimizer


def test_the_optimizer_gets_its_closure_by_keyword_as_in_lightning():
    from unittest.mock import patch

    from tests.helpers.boring import QUIET, BoringModel
    from trainer import Trainer

    real = torch.optim.SGD.step
    with patch.object(torch.optim.SGD, "step", autospec=True, side_effect=real) as step:
        Trainer(max_steps=1, limit_val_batches=0, **QUIET).fit(BoringModel())
    (call,) = step.call_args_list
    assert set(call.kwargs) == {"closure"} and len(call.args) == 1  # (self,), closure=...
