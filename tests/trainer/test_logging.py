"""self.log semantics: per-hook defaults, _step/_epoch keys, batch-size-weighted epoch means,
reduce_fx, prog_bar, torchmetrics objects, loggers and log_every_n_steps."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from tests.helpers.boring import QUIET, BoringModel, RandomDataset
from trainer import Trainer
from trainer.exceptions import MisconfigurationError
from trainer.loggers import CSVLogger, Logger, TensorBoardLogger


class MemoryLogger(Logger):
    def __init__(self) -> None:
        self.rows: list[tuple[int | None, dict[str, float]]] = []
        self.hparams: dict[str, Any] = {}

    name = "memory"
    version = 0

    def log_metrics(self, metrics, step=None):  # noqa: ANN001, ANN201
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params):  # noqa: ANN001, ANN201
        self.hparams.update(params)


def test_training_step_defaults_to_on_step_and_validation_to_on_epoch():
    class M(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("train_loss", loss)
            return loss

    logger = MemoryLogger()
    trainer = Trainer(max_epochs=1, log_every_n_steps=2, **{**QUIET, "logger": logger})
    trainer.fit(M())
    train_rows = [(s, m) for s, m in logger.rows if "train_loss" in m]
    assert [s for s, _ in train_rows] == [1, 3, 5, 7]  # Lightning's step: the optimizer steps before this one
    val_rows = [m for _, m in logger.rows if "val_loss" in m]
    assert len(val_rows) == 1 and val_rows[0]["epoch"] == 0
    assert set(trainer.callback_metrics) == {"train_loss", "val_loss"}
    assert trainer.logged_metrics["val_loss"] == pytest.approx(float(trainer.callback_metrics["val_loss"]))


def test_epoch_mean_is_weighted_by_batch_size():
    values: list[tuple[float, int]] = []

    class M(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            value = float(batch_idx + 1)
            values.append((value, len(batch)))
            self.log("weighted", value)

    # 10 samples, batch 4 → batch sizes 4, 4, 2
    loader = DataLoader(RandomDataset(32, 10), batch_size=4)
    result = Trainer(**QUIET).validate(M(), loader)
    expected = sum(v * n for v, n in values) / sum(n for _, n in values)
    assert result == [{"weighted": pytest.approx(expected)}]
    assert expected != pytest.approx(sum(v for v, _ in values) / 3)


def test_on_step_and_on_epoch_together_create_suffixed_keys():
    class M(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("loss", float(batch_idx), on_step=True, on_epoch=True, prog_bar=True)
            return loss

    logger = MemoryLogger()
    trainer = Trainer(max_epochs=1, log_every_n_steps=1, limit_val_batches=0, **{**QUIET, "logger": logger})
    trainer.fit(M())
    assert logger.rows[0] == (0, {"loss_step": 0.0, "epoch": 0})  # Lightning's step: the steps before this one
    assert logger.rows[-1] == (7, {"loss_epoch": 3.5, "epoch": 0})  # Lightning's: the last batch's step
    assert float(trainer.callback_metrics["loss_epoch"]) == 3.5
    assert float(trainer.callback_metrics["loss"]) == 3.5
    assert trainer.progress_bar_metrics == {"loss_step": 7.0, "loss_epoch": 3.5}


@pytest.mark.parametrize(("reduce_fx", "expected"), [("sum", 28.0), ("max", 7.0), ("min", 0.0), ("mean", 3.5)])
def test_reduce_fx(reduce_fx: str, expected: float):
    class M(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("v", torch.tensor(float(batch_idx)), reduce_fx=reduce_fx)

    assert Trainer(**QUIET).validate(M()) == [{"v": expected}]


def test_log_dict_and_explicit_batch_size():
    class M(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            self.log_dict({"a": float(batch_idx), "b": 1.0}, batch_size=1 if batch_idx == 0 else 3)

    result = Trainer(**QUIET).validate(M(), DataLoader(RandomDataset(32, 16), batch_size=8))
    assert result == [{"a": pytest.approx(0.75), "b": 1.0}]


def test_logging_from_a_hook_where_it_is_not_allowed():
    class M(BoringModel):
        def on_fit_start(self) -> None:
            self.log("x", 1.0)

    with pytest.raises(MisconfigurationError, match=r"self.log\('x'\) was called in 'on_fit_start'"):
        Trainer(max_epochs=1, **QUIET).fit(M())


def test_on_step_logging_in_an_epoch_hook_is_rejected():
    class M(BoringModel):
        def on_train_epoch_end(self) -> None:
            self.log("x", 1.0, on_step=True)

    with pytest.raises(MisconfigurationError, match=r"on_step=True\) is not allowed in 'on_train_epoch_end'"):
        Trainer(max_epochs=1, limit_val_batches=0, **QUIET).fit(M())


def test_logging_a_non_scalar_is_rejected():
    class M(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            out = self(batch)
            self.log("vec", out)
            return out.sum()

    with pytest.raises(MisconfigurationError, match=r"self.log\('vec'\) got a tensor of shape \(8, 2\)"):
        Trainer(max_epochs=1, **QUIET).fit(M())


def test_values_logged_in_epoch_end_hooks_are_collected():
    class M(BoringModel):
        def on_train_epoch_end(self) -> None:
            self.log("epoch_value", 5.0)

        def on_validation_epoch_end(self) -> None:
            self.log("val_epoch_value", 6.0)

    trainer = Trainer(max_epochs=1, **QUIET)
    trainer.fit(M())
    assert float(trainer.callback_metrics["epoch_value"]) == 5.0
    assert float(trainer.callback_metrics["val_epoch_value"]) == 6.0


def test_torchmetrics_metric_is_computed_and_reset_at_epoch_end():
    torchmetrics = pytest.importorskip("torchmetrics")

    class M(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.metric = torchmetrics.MeanMetric()

        def validation_step(self, batch: Any, batch_idx: int) -> Any:
            self.metric.update(torch.tensor(float(batch_idx)))
            self.log("mean_idx", self.metric)

    model = M()
    trainer = Trainer(**QUIET)
    assert trainer.validate(model) == [{"mean_idx": 3.5}]
    assert trainer.validate(model) == [{"mean_idx": 3.5}]  # reset in between, else it would still be 3.5 by luck
    assert model.metric.update_count == 0


def test_multiple_val_dataloaders_get_suffixes():
    class M(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
            self.log("v", float(dataloader_idx))

    loaders = [DataLoader(RandomDataset(32, 8), batch_size=4), DataLoader(RandomDataset(32, 8), batch_size=4)]
    result = Trainer(**QUIET).validate(M(), loaders)
    assert result == [{"v/dataloader_idx_0": 0.0}, {"v/dataloader_idx_1": 1.0}]


def test_csv_logger_writes_metrics_and_hparams(tmp_path: Path):
    class M(BoringModel):
        def __init__(self, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = super().training_step(batch, batch_idx)
            self.log("train_loss", loss)
            return loss

    logger = CSVLogger(tmp_path)
    Trainer(max_epochs=1, log_every_n_steps=4, **{**QUIET, "logger": logger}).fit(M())
    rows = list(csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")))
    assert [r["step"] for r in rows if r["train_loss"]] == ["3", "7"]  # Lightning's steps
    assert (Path(logger.log_dir) / "hparams.yaml").read_text() == "lr: 0.1\n"
    assert Path(logger.log_dir) == tmp_path / "csv_logs" / "version_0"


def test_default_logger_is_tensorboard_in_versioned_runs_folders(tmp_path: Path):
    pytest.importorskip("tensorboard")
    for version in range(2):
        trainer = Trainer(max_epochs=1, limit_train_batches=2, default_root_dir=tmp_path, enable_progress_bar=False,
                          enable_model_summary=False)
        trainer.fit(BoringModel())
        assert isinstance(trainer.logger, TensorBoardLogger)
        assert Path(trainer.log_dir) == tmp_path / "runs" / f"version_{version}"
        assert list(Path(trainer.log_dir).glob("events.out.tfevents.*"))
        assert list((Path(trainer.log_dir) / "checkpoints").glob("*.ckpt"))


def test_hparams_are_sent_to_the_logger():
    class M(BoringModel):
        def __init__(self, width: int = 4, name: str = "x") -> None:
            super().__init__()
            self.save_hyperparameters()

    logger = MemoryLogger()
    Trainer(max_epochs=1, limit_train_batches=1, **{**QUIET, "logger": logger}).fit(M(width=7))
    assert logger.hparams == {"width": 7, "name": "x"}


class _StepLoggingModel(BoringModel):
    """Logs at every validation and test batch with on_step=True (and once with on_epoch too)."""

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        self.log("val_both", float(batch_idx), on_step=True, on_epoch=True)
        self.log("val_only_step", float(batch_idx), on_step=True, on_epoch=False)

    def test_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("test_both", float(batch_idx), on_step=True)


def test_on_step_values_of_validation_and_test_reach_the_loggers_at_every_batch():
    """Lightning sends them at once, at the count of that loader's batches seen (across the fit's validations),
    with no `epoch` key and no log_every_n_steps; the sanity check sends nothing."""
    logger = MemoryLogger()
    trainer = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=2, limit_test_batches=3,
                      log_every_n_steps=50, **{**QUIET, "logger": logger})
    model = _StepLoggingModel()
    trainer.fit(model)
    val_rows = [(step, row) for step, row in logger.rows if "val_both_step" in row]
    assert val_rows == [(i, {"val_both_step": float(i % 2), "val_only_step": float(i % 2)}) for i in range(4)]
    trainer.test(model, verbose=False)
    test_rows = [(step, row) for step, row in logger.rows if "test_both_step" in row]
    assert test_rows == [(i, {"test_both_step": float(i)}) for i in range(3)]
    assert logger.rows[-1] == (4, {"test_both_epoch": 1.0, "epoch": 2})  # the epoch key in test() too


def test_step_and_epoch_keys_of_several_loaders_end_with_the_loader_suffix():
    logger = MemoryLogger()
    loaders = [DataLoader(RandomDataset(32, 8), batch_size=4), DataLoader(RandomDataset(32, 8), batch_size=4)]
    Trainer(**{**QUIET, "logger": logger}).validate(_StepLoggingModel(), loaders, verbose=False)
    keys = {key for _, row in logger.rows for key in row}
    expected = {f"{name}/dataloader_idx_{idx}" for name in ("val_both_step", "val_only_step", "val_both_epoch")
                for idx in (0, 1)}
    assert keys == expected | {"epoch"}
    assert [step for step, row in logger.rows if "val_both_step/dataloader_idx_1" in row] == [0, 1]


def test_logged_metrics_hold_tensors_of_every_logged_value_without_a_logger():
    """Lightning's `logged_metrics`: the latest step and epoch values as tensors, whether or not a logger is attached,
    without the `epoch` key that the loggers get."""
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=2, **QUIET)
    trainer.fit(_StepLoggingModel())
    logged = trainer.logged_metrics
    assert set(logged) == {"val_both_step", "val_only_step", "val_both_epoch"}
    assert all(isinstance(value, torch.Tensor) for value in logged.values())
    assert float(logged["val_both_epoch"]) == 0.5


def test_a_name_logged_in_two_hooks_keeps_both_values_and_the_epoch_end_one_shows_last():
    """Lightning keeps one value per hook and name: a name logged in training_step (a step value) and again in
    on_train_epoch_end (an epoch value) shows the step value during the epoch and the epoch value after it."""
    seen = []

    class M(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.log("shared", 100.0, prog_bar=True, logger=False)
            return super().training_step(batch, batch_idx)

        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            seen.append(float(self.trainer.callback_metrics["shared"]))

        def on_train_epoch_end(self) -> None:
            self.log("shared", 111.0, prog_bar=True, logger=False)

    trainer = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, **QUIET)
    trainer.fit(M())
    assert seen == [100.0] * 4
    assert trainer.progress_bar_metrics["shared"] == 111.0 and float(trainer.callback_metrics["shared"]) == 111.0
