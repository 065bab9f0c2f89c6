"""CSVLogger and TensorBoardLogger with Lightning 2.6's surface: `log_hyperparams` with and without metrics,
`hparams.yaml`, `hp_metric`, `log_graph`, `root_dir`, `experiment` (CSV's `ExperimentWriter`), `prefix`, `sub_dir`,
a `name` of None, and metrics.csv as Lightning writes it (sorted columns, appended rows, an `epoch` on every row,
the test row included). Lightning's own loggers write the same run beside ours where files are compared."""

from __future__ import annotations

import csv
from argparse import Namespace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch.utils.data import DataLoader

from tests.helpers.boring import QUIET, RandomDataset
from trainer import Trainer, TrainModule
from trainer.loggers import CSVLogger, ExperimentWriter, TensorBoardLogger
from trainer.loggers.base import DummyExperiment


def _rows(path: str | Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def _scalars(folder: str) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(folder)
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_csv_log_hyperparams_takes_nothing_a_namespace_or_a_nested_dict(tmp_path: Path):
    logger = CSVLogger(tmp_path, name=None)
    logger.log_hyperparams()
    assert logger.root_dir == str(tmp_path) and (tmp_path / "version_0" / "hparams.yaml").is_file()
    logger.log_hyperparams(Namespace(lr=0.1, layer=torch.nn.BatchNorm1d, nested={"a": {"b": "c"}}))
    written = yaml.safe_load((tmp_path / "version_0" / ExperimentWriter.NAME_HPARAMS_FILE).read_text())
    assert written == {"lr": 0.1, "layer": "torch.nn.modules.batchnorm.BatchNorm1d", "nested": {"a": {"b": "c"}}}


def test_csv_columns_are_sorted_rows_appended_and_a_new_column_rewrites_the_header(tmp_path: Path):
    logger = CSVLogger(tmp_path, name="exp", prefix="run", flush_logs_every_n_steps=1)
    assert isinstance(logger.experiment, ExperimentWriter)
    assert logger.root_dir == str(tmp_path / "exp")
    logger.log_metrics({"b": 1, "a": torch.tensor(2.0)}, step=0)
    logger.log_metrics({"b": 3}, step=1)
    assert _rows(logger.metrics_file) == (["run-a", "run-b", "step"],
                                          [{"run-a": "2.0", "run-b": "1", "step": "0"},
                                           {"run-a": "", "run-b": "3", "step": "1"}])
    logger.log_metrics({"c": 4}, step=2)
    header, rows = _rows(logger.experiment.metrics_file_path)
    assert header == ["run-a", "run-b", "run-c", "step"] and [r["step"] for r in rows] == ["0", "1", "2"]


def test_csv_a_version_given_again_starts_a_fresh_metrics_file(tmp_path: Path):
    first = CSVLogger(tmp_path, name="exp", version=0)
    first.log_metrics({"x": 1}, step=0)
    first.save()
    second = CSVLogger(tmp_path, name="exp", version=0)
    with pytest.warns(UserWarning, match="exists and is not empty"):
        second.log_metrics({"y": 2}, step=0)
    second.save()
    assert _rows(second.metrics_file)[0] == ["step", "y"]


def test_other_ranks_get_a_do_nothing_experiment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from strategies.comm.distributed import rank_zero_only

    monkeypatch.setattr(rank_zero_only, "rank", 1)
    for logger in (CSVLogger(tmp_path), TensorBoardLogger(tmp_path)):
        assert isinstance(logger.experiment, DummyExperiment)
        logger.experiment.add_scalar("x", 1.0)  # no folder, no writer: nothing happens
    assert not any(tmp_path.iterdir())


class Logs(TrainModule):
    """Logs a training loss, an epoch value, validation and test losses."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(32, 2)
        self.example_input_array = torch.zeros(2, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self(batch).sum()
        self.log("train_loss", loss)
        self.log("zeta", 1.0, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("val_loss", self(batch).sum())

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("test_loss", self(batch).sum())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64), batch_size=8)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64, seed=1), batch_size=8)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 64, seed=2), batch_size=8)


RUN = {"max_epochs": 2, "limit_train_batches": 3, "limit_val_batches": 2, "limit_test_batches": 2,
       "log_every_n_steps": 2, "num_sanity_val_steps": 0}


def _lightning_csv(folder: Path) -> list[dict[str, str]]:
    pl = pytest.importorskip("lightning.pytorch")

    class Theirs(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.ours = Logs()
            self.layer = self.ours.layer

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = self.layer(batch).sum()
            self.log("train_loss", loss)
            self.log("zeta", 1.0, on_step=False, on_epoch=True)
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("val_loss", self.layer(batch).sum())

        def test_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("test_loss", self.layer(batch).sum())

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

        train_dataloader, val_dataloader, test_dataloader = (Logs.train_dataloader, Logs.val_dataloader,
                                                             Logs.test_dataloader)

    logger = pl.loggers.CSVLogger(folder, name="x")
    trainer = pl.Trainer(logger=logger, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, accelerator="cpu", devices=1, **RUN)
    model = Theirs()
    trainer.fit(model)
    trainer.test(model, verbose=False)
    return _rows(Path(logger.log_dir) / "metrics.csv")[1]


def test_csv_rows_of_a_fit_and_a_test_are_lightnings(tmp_path: Path):
    """The same columns, steps and epochs row for row (the values differ: each side draws its own weights)."""
    logger = CSVLogger(tmp_path / "ours", name="x")
    trainer = Trainer(**{**QUIET, "logger": logger, **RUN})
    model = Logs()
    trainer.fit(model)
    trainer.test(model, verbose=False)
    header, ours = _rows(logger.metrics_file)
    theirs = _lightning_csv(tmp_path / "theirs")
    assert header == ["epoch", "step", "test_loss", "train_loss", "val_loss", "zeta"]

    def shape(rows: list[dict[str, str]]) -> list[tuple[str, ...]]:
        return [(r["epoch"], r["step"], *(k for k in header[2:] if r[k])) for r in rows]

    assert shape(ours) == shape(theirs)
    assert ours[-1]["epoch"] == "2" and ours[-1]["test_loss"]  # the test row has the epoch, as in Lightning


def test_tensorboard_writes_hparams_yaml_hp_metric_and_the_graph(tmp_path: Path):
    logger = TensorBoardLogger(tmp_path, name="tb", log_graph=True)
    trainer = Trainer(**{**QUIET, "logger": logger, **RUN})
    trainer.fit(Logs())
    assert yaml.safe_load((Path(logger.log_dir) / "hparams.yaml").read_text()) == {"lr": 0.1}
    scalars = _scalars(logger.log_dir)
    assert scalars["hp_metric"] == [(0, -1.0)]
    assert [step for step, _ in scalars["epoch"]][:2] == [1, 2]  # `epoch` is logged beside the metrics
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert events.Graph() is not None  # log_graph=True drew the module from its example_input_array


def test_tensorboard_log_hyperparams_with_metrics_prefix_and_sub_dir(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RUNS", str(tmp_path))
    logger = TensorBoardLogger("$RUNS", name=None, version="v", prefix="p", sub_dir="events",
                               default_hp_metric=False)
    assert logger.log_dir == str(tmp_path / "v" / "events")
    logger.log_hyperparams({"a": 1, "nested": {"b": 2}}, {"score": torch.tensor(0.5)})
    logger.log_hyperparams({"c": 3})  # no metrics and no default hp_metric: recorded for hparams.yaml only
    logger.save()
    assert _scalars(logger.log_dir) == {"p-score": [(0, 0.5)]}
    assert yaml.safe_load((tmp_path / "v" / "events" / "hparams.yaml").read_text()) == \
        {"a": 1, "nested": {"b": 2}, "c": 3}


def test_log_graph_without_an_input_warns(tmp_path: Path):
    logger = TensorBoardLogger(tmp_path, log_graph=True)
    with pytest.warns(UserWarning, match="example_input_array` attribute is not set"):
        logger.log_graph(torch.nn.Linear(2, 2))
    with pytest.warns(UserWarning, match="can't be traced"):
        logger.log_graph(torch.nn.Linear(2, 2), {"x": 1})
