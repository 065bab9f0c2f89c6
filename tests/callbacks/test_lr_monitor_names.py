"""LearningRateMonitor's names and values as Lightning's: a scheduler's `name`, param groups' names, param groups of
an optimizer without a scheduler, `lrs` and `last_momentum_values`, duplicate group names refused, and the values
in `callback_metrics` (EarlyStopping can monitor `lr-Adam`). Lightning's callback runs the same module beside ours."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import EarlyStopping, LearningRateMonitor
from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET, BoringModel, RandomDataset
from trainer import Trainer, TrainModule
from trainer.loggers import CSVLogger

RUN = {"max_epochs": 2, "limit_train_batches": 2, "limit_val_batches": 0, "log_every_n_steps": 1}


def _optimizers(module: nn.Module, case: str) -> Any:
    first, second = module.layer[0], module.layer[1]
    if case == "named_scheduler":
        opt = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
        return [opt], [{"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5), "name": "my_lr"}]
    if case == "named_groups":
        opt = torch.optim.SGD([{"params": first.parameters(), "name": "linear"},
                               {"params": second.parameters(), "name": "head", "lr": 0.01}], lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)]
    if case == "groups_without_scheduler":
        return torch.optim.Adam([{"params": first.parameters()}, {"params": second.parameters(), "lr": 0.02}],
                                lr=0.1)
    return torch.optim.Adam(module.parameters(), lr=0.1)


def _module_class(base: type, case: str) -> type:
    """The same module on our base or Lightning's, built with `case`'s optimizers."""

    class Module(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 2))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch).sum()

        def configure_optimizers(self) -> Any:
            return _optimizers(self, case)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(RandomDataset(32, 64), batch_size=8)

    return Module


def _ours(case: str, tmp_path: Any, **options: Any) -> tuple[LearningRateMonitor, Trainer]:
    Module = _module_class(TrainModule, case)
    monitor = LearningRateMonitor(**options)
    trainer = Trainer(**{**QUIET, **RUN, "logger": CSVLogger(tmp_path), "callbacks": [monitor]})
    trainer.fit(Module())
    return monitor, trainer


def _lightnings(case: str, tmp_path: Any, **options: Any) -> Any:
    pl = pytest.importorskip("lightning.pytorch")

    Module = _module_class(pl.LightningModule, case)
    monitor = pl.callbacks.LearningRateMonitor(**options)
    trainer = pl.Trainer(callbacks=[monitor], logger=pl.loggers.CSVLogger(tmp_path), enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, accelerator="cpu", devices=1, **RUN)
    trainer.fit(Module())
    return monitor


@pytest.mark.parametrize(("case", "names"), [
    ("named_scheduler", ["my_lr"]),
    ("named_groups", ["lr-SGD/linear", "lr-SGD/head"]),
    ("groups_without_scheduler", ["lr-Adam/pg1", "lr-Adam/pg2"]),
])
def test_names_and_values_are_lightnings(case: str, names: list[str], tmp_path: Any):
    ours, trainer = _ours(case, tmp_path / "ours", log_momentum=True)
    theirs = _lightnings(case, tmp_path / "theirs", log_momentum=True)
    assert list(ours.lrs) == names
    assert ours.lrs == theirs.lrs
    assert ours.last_momentum_values == theirs.last_momentum_values
    assert set(names) <= set(trainer.callback_metrics)


def test_duplicate_group_names_are_refused(tmp_path: Any):
    class Twice(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(32, 2), nn.Linear(32, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return (self.a(batch) + self.b(batch)).sum()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD([{"params": self.a.parameters(), "name": "same"},
                                    {"params": self.b.parameters(), "name": "same"}], lr=0.1)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(RandomDataset(32, 16), batch_size=8)

    trainer = Trainer(**{**QUIET, **RUN, "logger": CSVLogger(tmp_path), "callbacks": [LearningRateMonitor()]})
    with pytest.raises(MisconfigurationError, match="duplicated parameter group names \\['same'\\]"):
        trainer.fit(Twice())


def test_early_stopping_can_monitor_the_learning_rate(tmp_path: Any):
    """The learning rate is in callback_metrics, as in Lightning: a constant one never improves."""

    class AdamModel(BoringModel):
        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=0.1)

    stop = EarlyStopping(monitor="lr-Adam", patience=1, mode="min")
    trainer = Trainer(**{**QUIET, **RUN, "max_epochs": 5, "logger": CSVLogger(tmp_path),
                         "callbacks": [LearningRateMonitor(logging_interval="epoch"), stop]})
    trainer.fit(AdamModel())
    assert float(trainer.callback_metrics["lr-Adam"]) == pytest.approx(0.1)
    assert stop.stopping_reason.name == "PATIENCE_EXHAUSTED" and trainer.current_epoch < 5
