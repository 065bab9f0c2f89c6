"""Tuner.lr_find: Lightning's learning-rate range test (the same rates, smoothed losses and suggestion as Lightning
2.6, tested side by side), run in a trial Trainer that leaves the user's Trainer, folders and weights as they were,
and its plot saved beside the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import Callback
from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, regression_data
from trainer import Trainer, TrainModule, seed_everything
from trainer.tuner import Tuner
from trainer.tuner.lr_finder import sweep_lr

NUM_TRAINING = 40


class _Body:
    def _build(self, lr: float) -> None:
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)}


class Net(_Body, TrainModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self._build(lr)


def _loader() -> DataLoader:
    return DataLoader(regression_data(n=NUM_TRAINING * 8), batch_size=8)


def test_the_sweep_follows_lightnings_schedule():
    assert sweep_lr(0, 1e-6, 1.0, 10, "exponential") == 1e-6
    assert sweep_lr(9, 1e-6, 1.0, 10, "exponential") == pytest.approx(1.0)
    assert sweep_lr(1, 0.0001, 0.1, 10, "linear") == pytest.approx(0.0001 + 0.2 * (0.1 - 0.0001))


def test_lr_find_leaves_the_weights_and_the_trainer_as_they_were_and_sets_the_suggestion(tmp_path: Path):
    seed_everything(0)
    model = Net()
    before = {k: v.clone() for k, v in model.state_dict().items()}

    class Count(Callback):
        def __init__(self) -> None:
            self.batches = 0

        def on_train_batch_end(self, *args: Any) -> None:
            self.batches += 1

    counter = Count()
    trainer = Trainer(max_epochs=1, callbacks=[counter], **{**QUIET, "default_root_dir": tmp_path})
    finder = Tuner(trainer).lr_find(model, _loader(), num_training=NUM_TRAINING, min_lr=1e-5, max_lr=10.0)
    assert finder is not None
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert counter.batches == 0 and trainer.global_step == 0  # the user's Trainer did not run
    assert model.lr == finder.suggestion() and 1e-5 < model.lr < 10.0
    assert finder.plot_path == tmp_path / "lr_find.png" and finder.plot_path.stat().st_size > 0
    trainer.fit(model, _loader())
    assert trainer.global_step == NUM_TRAINING and counter.batches == NUM_TRAINING


def test_a_diverging_loss_stops_the_sweep_early():
    seed_everything(0)
    finder = Tuner(Trainer(max_epochs=1, **QUIET)).lr_find(Net(), _loader(), num_training=NUM_TRAINING,
                                                             min_lr=1e-2, max_lr=1e4, update_attr=False)
    assert finder is not None and len(finder.results["lr"]) < NUM_TRAINING
    assert finder.results["loss"][-1] > 4.0 * min(finder.results["loss"])


def test_bad_arguments_are_refused_early():
    tuner = Tuner(Trainer(max_epochs=1, **QUIET))
    with pytest.raises(ConfigError, match="method='fit' only"):
        tuner.lr_find(Net(), _loader(), method="validate")
    with pytest.raises(ConfigError, match="min_lr < max_lr"):
        tuner.lr_find(Net(), _loader(), min_lr=1.0, max_lr=0.1)

    class NoLr(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(32, 1)

    with pytest.raises(ConfigError, match="`lr` or `learning_rate`"):
        tuner.lr_find(NoLr(), _loader())


def test_lr_find_matches_lightning():
    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.tuner import Tuner as LightningTuner

    class Theirs(_Body, lightning.LightningModule):
        def __init__(self, lr: float = 1e-3) -> None:
            super().__init__()
            self._build(lr)

    kwargs = {"num_training": NUM_TRAINING, "min_lr": 1e-5, "max_lr": 10.0}
    seed_everything(0)
    ours_model = Net()
    ours = Tuner(Trainer(max_epochs=1, **QUIET)).lr_find(ours_model, _loader(), **kwargs)
    seed_everything(0)
    theirs_model = Theirs()
    trainer = lightning.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, accelerator="cpu", devices=1)
    theirs = LightningTuner(trainer).lr_find(theirs_model, _loader(), **kwargs)
    assert ours is not None and theirs is not None
    assert ours.results["lr"] == pytest.approx(theirs.results["lr"], rel=1e-12)
    assert ours.results["loss"] == pytest.approx(theirs.results["loss"], rel=1e-6)
    assert ours.suggestion() == pytest.approx(theirs.suggestion(), rel=1e-12)
    assert ours_model.lr == pytest.approx(theirs_model.lr, rel=1e-12)
