"""The optimizer path's other hooks, as Lightning 2.x documents them: `configure_gradient_clipping` /
`clip_gradients`, `lr_scheduler_step` (custom schedulers, the monitored metric, `reduce_on_plateau`), `self.log` in
`optimizer_step`, and what a window whose batches were all skipped does."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from strategies.exceptions import MisconfigurationError
from tests.compat.test_optimizer_path import FLAGS, Regression, _loader
from trainer import Trainer


# --- gradient clipping ------------------------------------------------------------------------------------
def test_configure_gradient_clipping_is_called_every_step_with_the_flags():
    class Model(Regression):
        def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                        gradient_clip_algorithm: Any = None) -> None:
            self.calls.append(("clip", optimizer, gradient_clip_val, gradient_clip_algorithm))
            super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

        def on_train_batch_end(self, *args: Any) -> None:
            self.calls.append(("max_grad", max(p.grad.abs().max().item() for p in self.parameters())))

    model = Model()
    trainer = Trainer(max_epochs=1, gradient_clip_val=1e-3, gradient_clip_algorithm="value", **FLAGS)
    trainer.fit(model, _loader())
    clips = [c for c in model.calls if c[0] == "clip"]
    assert len(clips) == 6
    assert all(c[1] is trainer.optimizers[0] and c[2:] == (1e-3, "value") for c in clips)
    assert max(c[1] for c in model.calls if c[0] == "max_grad") <= torch.tensor(1e-3).item()  # the default clipped


def test_an_override_clips_its_own_way():
    class Model(Regression):
        def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                        gradient_clip_algorithm: Any = None) -> None:
            if self.current_epoch == 0:
                self.clip_gradients(optimizer, gradient_clip_val=1e-4, gradient_clip_algorithm="value")

        def on_train_batch_end(self, *args: Any) -> None:
            self.calls.append(("max_grad", self.current_epoch,
                               max(p.grad.abs().max().item() for p in self.parameters())))

    model = Model(lr=0.5)
    Trainer(max_epochs=2, **FLAGS).fit(model, _loader())
    grads = [c for c in model.calls if c[0] == "max_grad"]
    assert max(g for _, e, g in grads if e == 0) <= torch.tensor(1e-4).item()
    assert max(g for _, e, g in grads if e == 1) > 1e-4  # not clipped in epoch 1


def test_clip_gradients_refuses_a_value_that_contradicts_the_trainer_flag():
    class Model(Regression):
        def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                        gradient_clip_algorithm: Any = None) -> None:
            self.clip_gradients(optimizer, gradient_clip_val=0.1)

    with pytest.raises(MisconfigurationError, match="gradient_clip_val"):
        Trainer(max_epochs=1, gradient_clip_val=0.5, **FLAGS).fit(Model(), _loader())


# --- lr_scheduler_step -----------------------------------------------------------------------------------
class HalvingSchedule:
    """A scheduler that does not follow torch's API: it is stepped with the epoch number."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer, self.epochs = optimizer, []

    def step(self, epoch: int) -> None:
        self.epochs.append(epoch)
        for group in self.optimizer.param_groups:
            group["lr"] = 0.05 * 0.5 ** (epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": list(self.epochs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epochs = list(state["epochs"])


class CustomScheduled(Regression):
    def configure_optimizers(self) -> Any:
        opt = super().configure_optimizers()
        return {"optimizer": opt, "lr_scheduler": HalvingSchedule(opt)}


def test_a_scheduler_outside_torchs_api_needs_lr_scheduler_step():
    with pytest.raises(MisconfigurationError, match="lr_scheduler_step"):
        Trainer(max_epochs=1, **FLAGS).fit(CustomScheduled(), _loader())


def test_lr_scheduler_step_drives_a_custom_scheduler():
    class Model(CustomScheduled):
        def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
            self.calls.append(("lr_scheduler_step", scheduler, metric))
            scheduler.step(epoch=self.current_epoch)

    model = Model()
    trainer = Trainer(max_epochs=3, **FLAGS)
    trainer.fit(model, _loader())
    calls = [c for c in model.calls if c[0] == "lr_scheduler_step"]
    assert [(c[1], c[2]) for c in calls] == [(trainer.lr_scheduler_configs[0].scheduler, None)] * 3
    assert calls[0][1].epochs == [0, 1, 2]
    assert trainer.optimizers[0].param_groups[0]["lr"] == 0.05 * 0.5 ** 3


class LogsLoss(Regression):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, on_epoch=True)  # the metric the schedulers below monitor
        return loss


def test_lr_scheduler_step_gets_the_monitored_metric():
    class Model(LogsLoss):
        def configure_optimizers(self) -> Any:
            opt = super().configure_optimizers()
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "train_loss_epoch"}}

        def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
            self.calls.append(("lr_scheduler_step", metric, self.trainer.callback_metrics["train_loss_epoch"]))
            super().lr_scheduler_step(scheduler, metric)

    model = Model()
    Trainer(max_epochs=2, **FLAGS).fit(model, _loader())
    calls = [c for c in model.calls if c[0] == "lr_scheduler_step"]
    assert len(calls) == 2 and all(c[1] == float(c[2]) for c in calls)


def test_self_log_works_inside_optimizer_step():
    class Model(Regression):
        def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any) -> None:
            optimizer.step(closure=optimizer_closure)
            self.log("lr", optimizer.param_groups[0]["lr"])

    trainer = Trainer(max_epochs=1, **FLAGS)
    trainer.fit(Model(), _loader())
    assert float(trainer.callback_metrics["lr"]) == pytest.approx(0.05)


class HalvingPlateau(HalvingSchedule):
    """A custom scheduler that reacts to a metric (declared with `reduce_on_plateau`)."""

    def step(self, metric: float) -> None:  # type: ignore[override]
        self.epochs.append(metric)


def test_the_reduce_on_plateau_key_sends_the_monitored_metric_to_lr_scheduler_step():
    class Model(LogsLoss):
        def configure_optimizers(self) -> Any:
            opt = super().configure_optimizers()
            return {"optimizer": opt, "lr_scheduler": {"scheduler": HalvingPlateau(opt), "reduce_on_plateau": True,
                                                        "monitor": "train_loss_epoch"}}

        def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
            scheduler.step(metric)

    trainer = Trainer(max_epochs=2, **FLAGS)
    trainer.fit(Model(), _loader())
    seen = trainer.lr_scheduler_configs[0].scheduler.epochs
    assert len(seen) == 2 and all(isinstance(v, float) for v in seen)


# --- skipped batches ------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["32-true", "16-mixed"])
def test_a_window_of_skipped_batches_calls_optimizer_step_but_does_not_step(precision: str):
    """optimizer_step is called (its closure runs training_step), as in Lightning; with no gradients nothing moves,
    on_before_optimizer_step does not run, and global_step does not advance (Lightning counts it: see
    docs/index.md)."""

    class Model(Regression):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            return None if batch_idx in (2, 3) else loss

        def optimizer_step(self, *args: Any) -> None:
            self.calls.append(("optimizer_step", args[1]))
            super().optimizer_step(*args)

        def on_before_optimizer_step(self, optimizer: Any) -> None:
            self.calls.append(("on_before_optimizer_step",))

    model = Model()
    trainer = Trainer(max_epochs=1, accumulate_grad_batches=2, precision=precision, **FLAGS)
    trainer.fit(model, _loader())
    assert [c[1] for c in model.calls if c[0] == "optimizer_step"] == [1, 3, 5]
    assert len([c for c in model.calls if c[0] == "on_before_optimizer_step"]) == 2
    assert trainer.global_step == 2


# --- manual optimization ----------------------------------------------------------------------------------
class ManualRegression(Regression):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss.detach()


def test_gradient_clip_val_with_manual_optimization_is_refused_as_in_lightning():
    with pytest.raises(MisconfigurationError, match="self.clip_gradients"):
        Trainer(max_epochs=1, gradient_clip_val=0.5, **FLAGS).fit(ManualRegression(), _loader())


def test_automatic_only_overrides_in_manual_optimization_are_named_not_ignored_silently():
    class Model(ManualRegression):
        def optimizer_step(self, *args: Any) -> None:
            raise AssertionError("not called in manual optimization")

        def configure_gradient_clipping(self, *args: Any) -> None:
            raise AssertionError("not called in manual optimization")

    with pytest.warns(UserWarning, match="overrides optimizer_step, configure_gradient_clipping"):
        Trainer(max_epochs=1, limit_train_batches=2, **FLAGS).fit(Model(), _loader())
