"""validate / test / predict entry points, DataModule, and which data source wins."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from tests.helpers.boring import QUIET, BoringModel, RandomDataset
from trainer import DataModule, Trainer
from trainer.exceptions import MisconfigurationError


class Data(DataModule):
    def __init__(self, length: int = 16) -> None:
        super().__init__()
        self.length = length
        self.calls: list[str] = []

    def prepare_data(self) -> None:
        self.calls.append("prepare_data")

    def setup(self, stage: str) -> None:
        self.calls.append(f"setup:{stage.value}")  # a TrainerFn, as in Lightning

    def teardown(self, stage: str) -> None:
        self.calls.append(f"teardown:{stage.value}")

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, self.length), batch_size=4)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, self.length), batch_size=4)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 8), batch_size=4)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 12), batch_size=4)


def test_datamodule_drives_fit_and_has_precedence_over_module_hooks():
    dm = Data(length=16)
    trainer = Trainer(max_epochs=1, **QUIET)
    trainer.fit(BoringModel(), datamodule=dm)
    assert trainer.global_step == 4  # datamodule's 16 samples / 4, not the module's 64 / 8
    assert dm.calls == ["prepare_data", "setup:fit", "teardown:fit"]
    assert trainer.datamodule is dm


def test_explicit_dataloaders_have_precedence_over_the_datamodule():
    trainer = Trainer(max_epochs=1, **QUIET)
    trainer.fit(BoringModel(), train_dataloaders=DataLoader(RandomDataset(32, 6), batch_size=2))
    assert trainer.global_step == 3


def test_datamodule_passed_positionally_to_fit():
    trainer = Trainer(max_epochs=1, **QUIET)
    trainer.fit(BoringModel(), Data(length=8))
    assert trainer.global_step == 2


def test_validate_and_test_return_metrics_per_loader():
    model = BoringModel()
    trainer = Trainer(**QUIET)
    (val,) = trainer.validate(model)
    (test,) = trainer.test(model, datamodule=Data())
    assert set(val) == {"val_loss"} and set(test) == {"test_loss"}
    assert trainer.state.fn.value == "test"
    assert model.training  # evaluation puts the module back in its previous mode


def test_evaluation_runs_without_gradients_and_limits_batches():
    seen: list[bool] = []

    class M(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            seen.append(torch.is_grad_enabled() or self.training)
            return super().validation_step(batch, batch_idx)

    Trainer(limit_val_batches=3, **QUIET).validate(M())
    assert seen == [False, False, False]


def test_predict_returns_outputs_in_order():
    model = BoringModel()
    preds = Trainer(**QUIET).predict(model, DataLoader(RandomDataset(32, 10), batch_size=4))
    assert [p.shape[0] for p in preds] == [4, 4, 2]
    assert Trainer(**QUIET).predict(model, datamodule=Data(), return_predictions=False) is None


def test_test_needs_test_step_and_data():
    class NoTest(BoringModel):
        test_step = BoringModel.__mro__[1].test_step

    with pytest.raises(MisconfigurationError, match=r"must define test_step"):
        Trainer(**QUIET).test(NoTest())

    class NoData(BoringModel):
        test_dataloader = BoringModel.__mro__[1].test_dataloader

    with pytest.raises(MisconfigurationError, match=r"test\(\) found no data"):
        Trainer(**QUIET).test(NoData())


def test_validate_reuses_the_fitted_model():
    trainer = Trainer(max_epochs=1, **QUIET)
    model = BoringModel()
    trainer.fit(model)
    assert set(trainer.validate(model)[0]) == {"val_loss"}
