"""LearningRateFinder and BatchSizeFinder against Lightning 2.6.6: the same suggestion / batch size, and the run goes
on training (or testing) with it, as Lightning's does. The searches are the Tuner's (tests/tuner/); here what the
callbacks add: when they run, what they change in the run, and that the rest of the run is the run that the found
value would have given from the start."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import BatchSizeFinder, LearningRateFinder
from strategies.exceptions import ConfigError, MisconfigurationError
from tests.helpers.boring import QUIET, regression_data
from trainer import Trainer, TrainModule, seed_everything

FITS = 40  # a batch of more samples than this asks the allocator for terabytes


def _check_fits(x: torch.Tensor) -> None:
    torch.empty(max(0, x.shape[0] - FITS) * 2**40, dtype=torch.uint8)


class _Body:
    def _build(self) -> None:
        torch.manual_seed(0)
        self.net = nn.Linear(32, 1)
        self.batch_size, self.lr = 8, 1e-3
        self.seen: list[tuple[str, int, float]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        _check_fits(x)
        self.seen.append(("train", x.shape[0], self.trainer.optimizers[0].param_groups[0]["lr"]))
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        _check_fits(batch[0])

    def test_step(self, batch: Any, batch_idx: int) -> None:
        _check_fits(batch[0])
        self.seen.append(("test", batch[0].shape[0], 0.0))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(n=512), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(n=64, seed=1), batch_size=self.batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(n=512, seed=2), batch_size=self.batch_size)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5)}


class Net(_Body, TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self._build()


def _theirs() -> tuple[Any, type]:
    lightning = pytest.importorskip("lightning.pytorch")

    class Theirs(_Body, lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self._build()

    return lightning, Theirs


def _lightning_trainer(lightning: Any, **flags: Any) -> Any:
    return lightning.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, accelerator="cpu", devices=1, **flags)


LR_ARGS = {"num_training_steps": 20, "min_lr": 1e-5, "max_lr": 10.0}


def test_learning_rate_finder_matches_lightning_and_the_run_trains_with_the_suggestion():
    lightning, Theirs = _theirs()
    from lightning.pytorch.callbacks import LearningRateFinder as LightningLearningRateFinder

    ours_model, theirs_model = Net(), Theirs()
    ours, theirs = LearningRateFinder(**LR_ARGS), LightningLearningRateFinder(**LR_ARGS)
    trainer = Trainer(max_steps=3, limit_val_batches=0, callbacks=[ours], **QUIET)
    seed_everything(0)
    trainer.fit(ours_model)
    seed_everything(0)
    _lightning_trainer(lightning, max_steps=3, limit_val_batches=0, callbacks=[theirs]).fit(theirs_model)
    assert ours.optimal_lr is not None and theirs.optimal_lr is not None
    assert ours.optimal_lr.results["lr"] == pytest.approx(theirs.optimal_lr.results["lr"], rel=1e-12)
    assert ours.optimal_lr.results["loss"] == pytest.approx(theirs.optimal_lr.results["loss"], rel=1e-6)
    suggestion = ours.optimal_lr.suggestion()
    assert suggestion == pytest.approx(theirs.optimal_lr.suggestion(), rel=1e-12)
    assert ours_model.lr == pytest.approx(theirs_model.lr, rel=1e-12) and ours_model.lr == suggestion
    # the sweep's steps and then the run's three steps, at the suggestion
    assert [(what, size) for what, size, _ in ours_model.seen] == [(what, size) for what, size, _ in theirs_model.seen]
    assert [lr for *_, lr in ours_model.seen] == pytest.approx([lr for *_, lr in theirs_model.seen], rel=1e-12)
    assert ours_model.seen[-3:] == [("train", 8, suggestion)] * 3
    assert trainer.global_step == 3 and ours_model.trainer is trainer


def test_the_run_after_the_search_is_the_run_the_suggestion_gives_from_the_start():
    found = Net()
    finder = LearningRateFinder(**LR_ARGS)
    seed_everything(0)
    Trainer(max_steps=5, limit_val_batches=0, callbacks=[finder], **QUIET).fit(found)
    assert finder.optimal_lr is not None and finder.optimal_lr.suggestion() is not None
    given = Net()
    given.lr = finder.optimal_lr.suggestion()
    seed_everything(0)
    Trainer(max_steps=5, limit_val_batches=0, **QUIET).fit(given)
    assert all(torch.equal(a, b) for a, b in zip(found.parameters(), given.parameters(), strict=True))


@pytest.mark.parametrize("mode", ["power", "binsearch"])
def test_batch_size_finder_matches_lightning_and_the_run_trains_with_the_size(mode: str):
    lightning, Theirs = _theirs()
    from lightning.pytorch.callbacks import BatchSizeFinder as LightningBatchSizeFinder

    ours_model, theirs_model = Net(), Theirs()
    ours, theirs = BatchSizeFinder(mode=mode), LightningBatchSizeFinder(mode=mode)
    flags = {"max_steps": 3, "limit_val_batches": 2, "num_sanity_val_steps": 0}
    seed_everything(0)
    Trainer(**flags, callbacks=[ours], **QUIET).fit(ours_model)
    seed_everything(0)
    _lightning_trainer(lightning, **flags, callbacks=[theirs]).fit(theirs_model)
    assert ours.optimal_batch_size == theirs.optimal_batch_size == ours_model.batch_size == theirs_model.batch_size
    assert ours.optimal_batch_size == (32 if mode == "power" else 38)
    assert ours_model.seen[-3:] == theirs_model.seen[-3:] == [("train", ours.optimal_batch_size, 1e-3)] * 3


def test_batch_size_finder_scales_the_test_batch_size_as_lightning_does():
    lightning, Theirs = _theirs()
    from lightning.pytorch.callbacks import BatchSizeFinder as LightningBatchSizeFinder

    ours_model, theirs_model = Net(), Theirs()
    ours, theirs = BatchSizeFinder(), LightningBatchSizeFinder()
    Trainer(limit_test_batches=2, callbacks=[ours], **QUIET).test(ours_model, verbose=False)
    _lightning_trainer(lightning, limit_test_batches=2, callbacks=[theirs]).test(theirs_model, verbose=False)
    assert ours.optimal_batch_size == theirs.optimal_batch_size == 32
    assert ours_model.seen[-2:] == theirs_model.seen[-2:] == [("test", 32, 0.0)] * 2


def test_the_batch_size_search_leaves_weights_and_random_draws_as_they_were():
    found = Net()
    seed_everything(0)
    Trainer(max_steps=4, limit_val_batches=0, callbacks=[BatchSizeFinder()], **QUIET).fit(found)
    given = Net()
    given.batch_size = found.batch_size
    seed_everything(0)
    Trainer(max_steps=4, limit_val_batches=0, **QUIET).fit(given)
    assert all(torch.equal(a, b) for a, b in zip(found.parameters(), given.parameters(), strict=True))


def test_what_the_finders_cannot_do_is_refused():
    with pytest.raises(ConfigError, match="mode='steep'"):
        LearningRateFinder(mode="steep")
    with pytest.raises(ConfigError, match="mode='double'"):
        BatchSizeFinder(mode="double")
    with pytest.raises(ConfigError, match="margin"):
        BatchSizeFinder(margin=1.0)
    with pytest.raises(ConfigError, match="loaders passed in"):
        Trainer(max_steps=1, callbacks=[BatchSizeFinder()], **QUIET).fit(
            Net(), DataLoader(regression_data(), batch_size=2))
    with pytest.raises(MisconfigurationError, match="one process"):
        LearningRateFinder().setup(Trainer(devices=2, accelerator="cpu", strategy="ddp"), Net(), "fit")
    with pytest.raises(MisconfigurationError, match="one process"):
        BatchSizeFinder().setup(Trainer(devices=2, accelerator="cpu", strategy="ddp"), Net(), "fit")
