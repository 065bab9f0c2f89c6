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
