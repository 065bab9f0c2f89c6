"""The same module run by Lightning 2.x (our compatibility oracle, when installed) and by this Trainer: the hooks of
this part of issue 20 are called in the same order, logged torchmetrics are reset at the same points, callbacks from
`configure_callbacks` are merged the same way, and training ends with the same weights. Skipped without Lightning."""

from __future__ import annotations

import tempfile
import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

_QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
          "enable_model_summary": False, "accelerator": "cpu", "devices": 1}


def _frameworks() -> dict[str, Any]:
    pl = pytest.importorskip("lightning.pytorch")
    pytest.importorskip("torchmetrics")
    import callbacks
    import trainer

    return {
        "lightning": (pl.LightningModule, pl.LightningDataModule, pl.Trainer, pl.callbacks),
        "ours": (trainer.TrainModule, trainer.DataModule, trainer.Trainer, callbacks),
    }


def _data(n: int = 32) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 8, generator=gen), torch.randint(0, 2, (n,), generator=gen))


class _Hooked:
    """The module body, mixed into either framework's module class by `_hooked_model`."""

    def __init__(self) -> None:
        import torchmetrics

        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 1)
        self.norm = torch.nn.BatchNorm1d(8)
        self.val_acc = torchmetrics.Accuracy(task="binary")
        self.train_acc = torchmetrics.Accuracy(task="binary")
        self.best = torchmetrics.MaxMetric()
        self.calls: list[Any] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.norm(x))[:, 0]

    def training_step(self, batch: Any) -> Any:  # no batch_idx
        x, y = batch
        logits = self(x)
        self.train_acc((logits > 0).long(), y)
        self.log("train_acc", self.train_acc, on_step=True, on_epoch=False)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float())
        self.log("loss", loss, True)  # prog_bar by position
        return loss

    def validation_step(self, batch: Any) -> None:  # no batch_idx
        x, y = batch
        self.val_acc((self(x) > 0).long(), y)
        self.log("val_acc", self.val_acc)

    def on_validation_epoch_end(self) -> None:
        acc = self.val_acc.compute()
        self.best(acc)
        self.log("val_acc_best", self.best.compute())
        self.calls.append(("val_end", int(self.val_acc.update_count), int(self.train_acc.update_count)))

    def on_train_epoch_start(self) -> None:
        self.calls.append(("train_start", int(self.train_acc.update_count), int(self.val_acc.update_count)))

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append("before")
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        self.calls.append(("transfer", device.type))
        return [t.to(device) for t in batch]

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append("after")
        return batch

    def on_validation_model_eval(self) -> None:
        self.calls.append(("model_eval", self.training))
        super().on_validation_model_eval()

    def on_validation_model_train(self) -> None:
        self.calls.append(("model_train", self.training))
        super().on_validation_model_train()

    def on_validation_model_zero_grad(self) -> None:
        self.calls.append("model_zero_grad")
        super().on_validation_model_zero_grad()

    def on_validation_start(self) -> None:
        self.calls.append("validation_start")

    def on_validation_end(self) -> None:
        self.calls.append("validation_end")

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.5)


def _hooked_model(base: type) -> Any:
    return type("Hooked", (_Hooked, base), {})()


def _fit_hooked(name: str, frameworks: dict[str, Any]) -> tuple[list[Any], dict[str, float], list[str], torch.Tensor]:
    module_base, _, trainer_cls, _ = frameworks[name]
    model = _hooked_model(module_base)
    trainer = trainer_cls(max_epochs=2, num_sanity_val_steps=1, limit_train_batches=3, limit_val_batches=2, **_QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, DataLoader(_data(), batch_size=8), DataLoader(_data(), batch_size=8))
    metrics = {k: round(float(v), 6) for k, v in trainer.callback_metrics.items()}
    return model.calls, metrics, sorted(trainer.progress_bar_metrics), model.layer.weight.detach().clone()


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    frameworks = _frameworks()
    return {name: _fit_hooked(name, frameworks) for name in frameworks}


def test_hook_calls_and_metric_resets_match_lightning(runs: dict[str, Any]):
    assert runs["ours"][0] == runs["lightning"][0]


def test_logged_values_and_progress_bar_keys_match_lightning(runs: dict[str, Any]):
    assert runs["ours"][1:3] == runs["lightning"][1:3]


def test_weights_after_fit_match_lightning(runs: dict[str, Any]):
    assert torch.equal(runs["ours"][3], runs["lightning"][3])


def _stage(stage: Any) -> str:
    return str(getattr(stage, "value", stage))  # Lightning passes a str enum


class _StartData:
    calls: list[str]

    def prepare_data(self) -> None:
        self.calls.append("datamodule.prepare_data")

    def setup(self, stage: str) -> None:
        self.calls.append(f"datamodule.setup:{_stage(stage)}")

    def train_dataloader(self) -> Any:
        return DataLoader(_data(8), batch_size=4)


class _StartModel:
    calls: list[str]
    returned: list[Any]

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def prepare_data(self) -> None:
        self.calls.append("prepare_data")

    def setup(self, stage: str) -> None:
        self.calls.append(f"setup:{_stage(stage)}")

    def configure_model(self) -> None:
        self.calls.append("configure_model")

    def configure_callbacks(self) -> Any:
        return self.returned

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self.layer(batch[0]).sum()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _run_start(name: str, frameworks: dict[str, Any]) -> tuple[list[str], list[str], list[Any]]:
    module_base, data_base, trainer_cls, cbs = frameworks[name]
    calls: list[str] = []
    marker = type("Marker", (cbs.Callback,), {})
    returned = [cbs.EarlyStopping(monitor="loss", patience=9), marker()]
    model = type("Model", (_StartModel, module_base), {"calls": calls, "returned": returned})()
    data = type("Data", (_StartData, data_base), {"calls": calls})()
    given = [cbs.ModelCheckpoint(dirpath=tempfile.mkdtemp()), cbs.EarlyStopping(monitor="loss", patience=1)]
    trainer = trainer_cls(max_epochs=1, callbacks=given, **{**_QUIET, "enable_checkpointing": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=data)
    names = [type(cb).__name__ for cb in trainer.callbacks]
    kept = [n for n in names if n in ("EarlyStopping", "Marker", "ModelCheckpoint")]
    return calls, kept, [cb.patience for cb in trainer.callbacks if type(cb).__name__ == "EarlyStopping"]


def test_prepare_data_configure_model_and_configure_callbacks_match_lightning():
    frameworks = _frameworks()
    assert _run_start("ours", frameworks) == _run_start("lightning", frameworks)
