"""The batch-transfer hooks, as Lightning documents them: `on_before_batch_transfer(batch, dataloader_idx)`,
`transfer_batch_to_device(batch, device, dataloader_idx)` and `on_after_batch_transfer(batch, dataloader_idx)` run in
that order on every train, validation, test and predict batch, before the batch hooks see it; a DataModule's
definition is used instead of the module's."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from tests.helpers.boring import QUIET, BoringModel, RandomDataset
from trainer import DataModule, Trainer


class Recorder(BoringModel):
    def __init__(self) -> None:
        super().__init__(batch_size=16, length=32)  # two batches per loader
        self.calls: list[tuple[str, Any]] = []

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append(("before", dataloader_idx))
        return batch * 0 + 1  # the hooks after this one must see this batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        self.calls.append(("transfer", device.type))
        assert torch.all(batch == 1)
        return batch + 1

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append(("after", dataloader_idx))
        assert torch.all(batch == 2)
        return batch + 1

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.calls.append(("train_batch_start", float(batch[0, 0])))

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.calls.append(("validation_batch_start", float(batch[0, 0])))

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.calls.append(("test_batch_start", float(batch[0, 0])))

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.calls.append(("predict_batch_start", float(batch[0, 0])))


_ONE_BATCH = [("before", 0), ("transfer", "cpu"), ("after", 0)]


def test_transfer_hooks_run_in_order_before_every_training_and_validation_batch():
    model = Recorder()
    Trainer(max_epochs=1, num_sanity_val_steps=0, **QUIET).fit(model)
    expected = [*_ONE_BATCH, ("train_batch_start", 3.0)] * 2 + [*_ONE_BATCH, ("validation_batch_start", 3.0)] * 2
    assert model.calls == expected


@pytest.mark.parametrize("entry", ["test", "predict"])
def test_transfer_hooks_run_before_every_test_and_predict_batch(entry: str):
    model = Recorder()
    getattr(Trainer(**QUIET), entry)(model)
    assert model.calls == [*_ONE_BATCH, (f"{entry}_batch_start", 3.0)] * 2


class _Pair:
    """A batch type with no `.to()`: only a user's transfer_batch_to_device can move it."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x


class CustomBatchModel(BoringModel):
    def train_dataloader(self) -> Any:
        return DataLoader(RandomDataset(32, 16), batch_size=8, collate_fn=lambda rows: _Pair(torch.stack(rows)))

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch.x.to(device)  # the step receives what this returns


def test_transfer_batch_to_device_moves_a_custom_batch_type():
    model = CustomBatchModel()
    Trainer(max_epochs=1, limit_val_batches=0, **QUIET).fit(model)
    assert model.global_step == 2


def test_transfer_hooks_get_the_index_of_each_validation_loader():
    class TwoLoaders(Recorder):
        def val_dataloader(self) -> Any:
            return [DataLoader(RandomDataset(32, 16), batch_size=16), DataLoader(RandomDataset(32, 16), batch_size=16)]

        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            return None

    model = TwoLoaders()
    Trainer(**QUIET).validate(model)
    assert [c for c in model.calls if c[0] == "before"] == [("before", 0), ("before", 1)]


class Data(DataModule):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def train_dataloader(self) -> Any:
        return DataLoader(RandomDataset(32, 16), batch_size=16)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append("before")
        return batch * 0 + 1

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append("after")
        return batch


def test_datamodule_transfer_hooks_run_instead_of_the_module_ones_with_a_warning():
    model, data = Recorder(), Data()
    with pytest.warns(UserWarning, match="on_before_batch_transfer` is defined on both"):
        Trainer(max_epochs=1, limit_val_batches=0, **QUIET).fit(model, datamodule=data)
    assert data.calls == ["before", "after"]
    assert model.calls == [("transfer", "cpu"), ("train_batch_start", 2.0)]  # the module's transfer still runs
