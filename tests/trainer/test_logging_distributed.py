"""Logging and callbacks under DDP (2 gloo ranks), and TensorBoard files read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import EarlyStopping
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.dist import run_distributed
from trainer import Trainer
from trainer.loggers import CSVLogger, TensorBoardLogger

DDP = {**QUIET, "devices": 2, "strategy": "ddp"}


def _classification() -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(30, 32, generator=gen), torch.randint(0, 3, (30,), generator=gen))


class Classifier(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        import torchmetrics

        self.layer = torch.nn.Linear(32, 3)
        self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=3)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.accuracy(self.layer(x).argmax(dim=1), y)
        self.log("acc", self.accuracy)


def _accuracy_rank(rank: int) -> float:
    torch.manual_seed(0)
    return Trainer(**DDP).validate(Classifier(), DataLoader(_classification(), batch_size=4))[0]["acc"]


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_torchmetrics_accuracy_on_two_ranks_equals_the_whole_set():
    pytest.importorskip("torchmetrics")
    ranks = run_distributed(_accuracy_rank)
    torch.manual_seed(0)
    single = Trainer(**QUIET).validate(Classifier(), DataLoader(_classification(), batch_size=4))[0]["acc"]
    assert ranks[0] == ranks[1] == pytest.approx(single, abs=1e-7)


class TriggersOnRankOne(BoringModel):
    """Only rank 1 sees a worsening metric; EarlyStopping must stop both ranks at the same step."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        worse = self.global_rank == 1 and self.current_epoch >= 1
        self.log("watched", float(self.current_epoch if worse else -self.current_epoch))


def _early_stop_rank(rank: int) -> tuple[int, int]:
    trainer = Trainer(max_epochs=10, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0,
                      callbacks=[EarlyStopping(monitor="watched", patience=1)], **DDP)
    trainer.fit(TriggersOnRankOne())
    return trainer.current_epoch, trainer.global_step


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_early_stopping_agrees_across_ranks_when_one_rank_triggers():
    rank0, rank1 = run_distributed(_early_stop_rank)
    assert rank0 == rank1 == (2, 4)


def _log_files_rank(rank: int, root: str) -> int:
    class Logs(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss)
            return loss

    folder = Path(root) / f"rank{rank}"  # each rank gets its own folder, so a stray write would show
    Trainer(max_epochs=1, log_every_n_steps=1, **{**DDP, "logger": [CSVLogger(folder), TensorBoardLogger(folder)]}
            ).fit(Logs())
    return rank


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_only_rank_zero_writes_log_files(tmp_path: Path):
    run_distributed(_log_files_rank, str(tmp_path))
    assert (tmp_path / "rank0" / "csv_logs" / "version_0" / "metrics.csv").is_file()
    assert list((tmp_path / "rank0" / "runs" / "version_0").glob("events.out.tfevents.*"))
    assert not (tmp_path / "rank1").exists()


def test_tensorboard_event_files_hold_the_expected_tags_and_steps(tmp_path: Path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

    class Logs(BoringModel):
        def __init__(self, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("train_loss", loss)
            return loss

    logger = TensorBoardLogger(tmp_path)
    Trainer(max_epochs=2, log_every_n_steps=4, **{**QUIET, "logger": logger}).fit(Logs())
    acc = event_accumulator.EventAccumulator(logger.log_dir)
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert {"train_loss", "val_loss"} <= set(scalars)
    assert [e.step for e in acc.Scalars("train_loss")] == [3, 7, 11, 15]  # Lightning's: the steps before
    assert [e.step for e in acc.Scalars("val_loss")] == [7, 15]
