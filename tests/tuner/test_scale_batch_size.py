"""Tuner.scale_batch_size: Lightning's power and binsearch searches (the same sizes as Lightning 2.6, tested side by
side) against a real out-of-memory error (the CPU allocator refusing a 1 TiB tensor once the batch passes a size),
the size set where the loaders read it, the module's weights and the random generators as before the search."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, regression_data
from trainer import DataModule, Trainer, TrainModule, seed_everything
from trainer.tuner import Tuner

FITS = 40  # a batch of more samples than this asks the allocator for terabytes


class _Body:
    def _build(self, batch_size: int, samples: int) -> None:
        self.batch_size = batch_size
        self.samples = samples
        self.net = nn.Linear(32, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        torch.empty(max(0, x.shape[0] - FITS) * 2**40, dtype=torch.uint8)  # fails for batches over FITS
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, _ = batch
        torch.empty(max(0, x.shape[0] - FITS) * 2**40, dtype=torch.uint8)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(n=self.samples), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(n=self.samples, seed=1), batch_size=self.batch_size)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Net(_Body, TrainModule):
    def __init__(self, batch_size: int = 8, samples: int = 512) -> None:
        super().__init__()
        self._build(batch_size, samples)


@pytest.mark.parametrize(("mode", "found"), [("power", 32), ("binsearch", 38)])
def test_the_largest_batch_that_fits_is_found_and_set(mode: str, found: int):
    model = Net()
    assert Tuner(Trainer(max_epochs=1, **QUIET)).scale_batch_size(model, mode=mode) == found
    assert model.batch_size == found  # binsearch ends at 40 and takes Lightning's 5 % margin off


def test_weights_and_random_generators_are_as_before_the_search():
    seed_everything(0)
    model = Net()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.get_rng_state()
    Tuner(Trainer(max_epochs=1, **QUIET)).scale_batch_size(model)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), state)


def test_the_search_stops_at_the_length_of_the_data_set():
    model = Net(samples=20)
    assert Tuner(Trainer(max_epochs=1, **QUIET)).scale_batch_size(model) == 32


def test_the_batch_size_of_a_datamodule_is_scaled():
    class Data(DataModule):
        def __init__(self) -> None:
            super().__init__()
            self.batch_size = 4

        def train_dataloader(self) -> DataLoader:
            return DataLoader(regression_data(n=512), batch_size=self.batch_size)

    class NoLoaders(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(32, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            torch.empty(max(0, x.shape[0] - FITS) * 2**40, dtype=torch.uint8)
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = Data()
    assert Tuner(Trainer(max_epochs=1, **QUIET)).scale_batch_size(NoLoaders(), datamodule=data) == 32
    assert data.batch_size == 32


def test_what_the_search_cannot_do_is_refused():
    tuner = Tuner(Trainer(max_epochs=1, **QUIET))
    with pytest.raises(ConfigError, match="loaders passed in"):
        tuner.scale_batch_size(Net(), DataLoader(regression_data(), batch_size=2))
    with pytest.raises(ConfigError, match="batch_arg_name='bs'"):
        tuner.scale_batch_size(Net(), batch_arg_name="bs")
    with pytest.raises(ConfigError, match="one process"):
        Tuner(Trainer(max_epochs=1, **{**QUIET, "devices": 2, "strategy": "ddp"})).scale_batch_size(Net())


def test_an_error_that_is_not_out_of_memory_propagates():
    class Broken(Net):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise RuntimeError("a bug in the step")

    with pytest.raises(RuntimeError, match="a bug in the step"):
        Tuner(Trainer(max_epochs=1, **QUIET)).scale_batch_size(Broken())


@pytest.mark.parametrize("mode", ["power", "binsearch"])
def test_scale_batch_size_matches_lightning(mode: str):
    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.tuner import Tuner as LightningTuner

    class Theirs(_Body, lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self._build(8, 512)

    trainer = lightning.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, accelerator="cpu", devices=1)
    theirs = LightningTuner(trainer).scale_batch_size(Theirs(), mode=mode)
    ours = Tuner(Trainer(max_epochs=1, **QUIET)).scale_batch_size(Net(), mode=mode)
    assert ours == theirs
