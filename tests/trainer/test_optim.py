"""configure_optimizers return forms and scheduler stepping (interval, frequency, monitor)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer
from trainer.core.optimizer_setup import normalize_optimizers


def _opt() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)


def test_every_accepted_return_form_normalizes():
    opt = _opt()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    assert normalize_optimizers(opt).optimizers == [opt]
    assert normalize_optimizers([opt]).optimizers == [opt]
    setup = normalize_optimizers(([opt], [sched]))
    assert setup.optimizers == [opt] and setup.schedulers[0].scheduler is sched
    setup = normalize_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step",
                                                                     "frequency": 3}})
    assert (setup.schedulers[0].interval, setup.schedulers[0].frequency) == ("step", 3)
    opt2 = _opt()
    setup = normalize_optimizers([{"optimizer": opt}, {"optimizer": opt2, "lr_scheduler": sched}])
    assert setup.optimizers == [opt, opt2] and len(setup.schedulers) == 1


class SchedModel(BoringModel):
    def __init__(self, interval: str, frequency: int = 1) -> None:
        super().__init__()
        self.interval, self.frequency = interval, frequency

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt,
                "lr_scheduler": {"scheduler": sched, "interval": self.interval, "frequency": self.frequency}}


@pytest.mark.parametrize(("interval", "frequency", "steps"), [("epoch", 1, 2), ("step", 1, 16), ("step", 5, 2),
                                                               ("epoch", 2, 1)])
def test_scheduler_interval_and_frequency(interval: str, frequency: int, steps: int):
    """A step-interval frequency counts the batches of each epoch, as Lightning's (8 per epoch: batch 5 of each)."""
    model = SchedModel(interval, frequency)
    trainer = Trainer(max_epochs=2, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == steps
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.5**steps)


def test_reduce_lr_on_plateau_reads_the_monitored_metric():
    class Plateau(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("flat", 1.0)

        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.1)
            return {"optimizer": opt, "lr_scheduler": sched, "monitor": "flat"}

    trainer = Trainer(max_epochs=3, limit_train_batches=1, **QUIET)
    trainer.fit(Plateau())
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.01)


def test_reduce_lr_on_plateau_with_an_unlogged_metric_names_what_was_logged():
    class Plateau(BoringModel):
        def configure_optimizers(self) -> Any:
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "monitor": "nope"}}

    with pytest.raises(Exception, match=r"ReduceLROnPlateau monitors 'nope', which was not logged.*val_loss"):
        Trainer(max_epochs=1, limit_train_batches=1, **QUIET).fit(Plateau())


def test_lr_schedulers_accessor():
    model = SchedModel("epoch")
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET).fit(model)
    assert isinstance(model.lr_schedulers(), torch.optim.lr_scheduler.StepLR)
    assert isinstance(model.optimizers(), torch.optim.SGD)


def test_an_epoch_left_with_minus_one_from_on_train_batch_start_still_steps_its_schedulers():
    """Lightning's rule: the batch that ends the epoch early counts as its last one for epoch schedulers."""

    class Model(SchedModel):
        def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
            return -1 if batch_idx == 3 else None

    trainer = Trainer(max_epochs=2, limit_val_batches=0, **QUIET)
    trainer.fit(Model("epoch", 1))
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 2 and trainer.global_step == 6


def test_configure_optimizers_returning_none_trains_without_an_optimizer():
    class Model(BoringModel):
        def configure_optimizers(self) -> Any:
            return None

    model = Model()
    before = [p.clone() for p in model.parameters()]
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, **QUIET)
    with pytest.warns(UserWarning, match="will run with no optimizer"):
        trainer.fit(model)
    assert trainer.global_step == 2 and all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_a_one_cycle_scheduler_stepped_per_epoch_is_warned_about():
    opt = torch.optim.SGD(BoringModel().parameters(), lr=0.1)
    with pytest.warns(RuntimeWarning, match="'interval': 'step'"):
        normalize_optimizers({"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, 10)})


def test_the_scheduler_config_says_whether_it_reduces_on_plateau():
    opt = torch.optim.SGD(BoringModel().parameters(), lr=0.1)
    plateau = normalize_optimizers({"optimizer": opt, "monitor": "x",
                                    "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt)})
    step = normalize_optimizers({"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1)})
    assert (plateau.schedulers[0].reduce_on_plateau, step.schedulers[0].reduce_on_plateau) == (True, False)


def test_manual_optimization_warns_that_the_stepping_keys_are_ignored():
    opt = torch.optim.SGD(BoringModel().parameters(), lr=0.1)
    config = {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt), "monitor": "loss"}
    with pytest.warns(RuntimeWarning, match="manual optimization ignores"):
        setup = normalize_optimizers({"optimizer": opt, "lr_scheduler": config}, allow_none=True, automatic=False)
    assert setup.schedulers[0].monitor == "loss"
