"""`self.log` / `self.log_dict` as Lightning documents them: the parameter order (`name, value, prog_bar, logger,
on_step, on_epoch, reduce_fx, enable_graph, sync_dist, sync_dist_group, add_dataloader_idx, batch_size,
metric_attribute, rank_zero_only`), `add_dataloader_idx`, `reduce_fx` given as a torch function; and torchmetrics
objects reset after the epoch-end hooks, so `compute()` inside them gives the epoch value."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from strategies.exceptions import MisconfigurationError
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, TrainModule

_LIGHTNING_LOG_ORDER = ["self", "name", "value", "prog_bar", "logger", "on_step", "on_epoch", "reduce_fx",
                        "enable_graph", "sync_dist", "sync_dist_group", "add_dataloader_idx", "batch_size",
                        "metric_attribute", "rank_zero_only"]


def test_log_has_lightnings_parameter_order():
    assert list(inspect.signature(TrainModule.log).parameters) == _LIGHTNING_LOG_ORDER


def test_log_dict_has_lightnings_parameter_order():
    expected = ["dictionary", *[p for p in _LIGHTNING_LOG_ORDER[3:] if p != "metric_attribute"]]
    assert list(inspect.signature(TrainModule.log_dict).parameters)[1:] == expected


class LogsPositionally(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self(batch).sum()
        self.log("positional", loss, True)  # Lightning: prog_bar=True
        self.log_dict({"from_dict": loss}, True)
        return loss


def test_third_positional_argument_is_prog_bar():
    trainer = Trainer(max_epochs=1, limit_val_batches=0, **QUIET)
    trainer.fit(LogsPositionally())
    assert {"positional", "from_dict"} <= set(trainer.progress_bar_metrics)


def test_logger_none_means_the_value_goes_to_the_loggers(tmp_path: Any):
    from trainer.loggers import CSVLogger

    class LogsWithDefaults(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            loss = self(batch).sum()
            self.log("default_logger", loss, logger=None)
            return loss

    trainer = Trainer(max_epochs=1, limit_val_batches=0, log_every_n_steps=1,
                      **{**QUIET, "logger": CSVLogger(tmp_path)})
    trainer.fit(LogsWithDefaults())
    assert "default_logger" in trainer.logged_metrics


class TwoValLoaders(BoringModel):
    def __init__(self, add_dataloader_idx: bool) -> None:
        super().__init__()
        self.add_idx = add_dataloader_idx

    def val_dataloader(self) -> Any:
        ones, threes = torch.ones(8, 32), torch.full((8, 32), 3.0)
        return [DataLoader(TensorDataset(ones), batch_size=4), DataLoader(TensorDataset(threes), batch_size=4)]

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.log("x", batch[0][0, 0], add_dataloader_idx=self.add_idx)
        self.log(f"own_name_{dataloader_idx}", batch[0][0, 0], add_dataloader_idx=False)


def test_add_dataloader_idx_true_appends_the_loader_index():
    trainer = Trainer(**QUIET)
    trainer.validate(TwoValLoaders(add_dataloader_idx=True))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("x")}
    assert metrics == {"x/dataloader_idx_0": 1.0, "x/dataloader_idx_1": 3.0}


def test_add_dataloader_idx_false_logs_the_name_as_given():
    trainer = Trainer(**QUIET)
    trainer.validate(TwoValLoaders(add_dataloader_idx=True))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("own_name")}
    assert metrics == {"own_name_0": 1.0, "own_name_1": 3.0}


def test_add_dataloader_idx_false_refuses_one_name_from_two_loaders():
    with pytest.raises(MisconfigurationError, match="called for two dataloaders"):  # Lightning refuses it too
        Trainer(**QUIET).validate(TwoValLoaders(add_dataloader_idx=False))


def test_add_dataloader_idx_refuses_a_name_that_already_holds_the_suffix():
    class Suffixed(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("x/dataloader_idx_0", 1.0)

    with pytest.raises(MisconfigurationError, match="add_dataloader_idx=False"):
        Trainer(**QUIET).validate(Suffixed())


def test_reduce_fx_accepts_torch_functions():
    class LogsMax(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("biggest", float(batch_idx), reduce_fx=torch.max)

    assert Trainer(**QUIET).validate(LogsMax())[0]["biggest"] == 7.0


@pytest.mark.parametrize(("option", "match"), [({"enable_graph": True}, "enable_graph"),
                                               ({"sync_dist_group": object()}, "sync_dist_group"),
                                               ({"rank_zero_only": True, "sync_dist": True}, "rank_zero_only")])
def test_unsupported_log_options_are_refused_by_name(option: dict[str, Any], match: str):
    class Logs(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("v", 1.0, **option)

    with pytest.raises(MisconfigurationError, match=match):
        Trainer(**QUIET).validate(Logs())


def _labelled(n: int = 32) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 32, generator=gen), torch.randint(0, 2, (n,), generator=gen))


class TemplateModel(BoringModel):
    """The shape of a popular template: the accuracy is logged as a metric object, and the best accuracy so far is
    tracked in on_validation_epoch_end with `self.val_acc.compute()`."""

    def __init__(self) -> None:
        super().__init__()
        import torchmetrics

        self.val_acc = torchmetrics.Accuracy(task="binary")
        self.train_acc = torchmetrics.Accuracy(task="binary")
        self.val_acc_best = torchmetrics.MaxMetric()
        self.seen_in_hooks: dict[str, float] = {}

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        logits = self.layer(x)[:, 0]
        self.train_acc((logits > 0).long(), y)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float())

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.val_acc((self.layer(x)[:, 0] > 0).long(), y)
        self.log("val/acc", self.val_acc)

    def on_train_epoch_end(self) -> None:
        self.seen_in_hooks["train"] = float(self.train_acc.compute())

    def on_validation_epoch_end(self) -> None:
        acc = self.val_acc.compute()
        self.seen_in_hooks["val"] = float(acc)
        self.val_acc_best(acc)
        self.log("val/acc_best", self.val_acc_best.compute(), prog_bar=True)

    def train_dataloader(self) -> Any:
        return DataLoader(_labelled(), batch_size=8)

    def val_dataloader(self) -> Any:
        return DataLoader(_labelled(), batch_size=8)


def test_metric_compute_in_validation_epoch_end_gives_the_epoch_value():
    pytest.importorskip("torchmetrics")
    model = TemplateModel()
    trainer = Trainer(max_epochs=1, num_sanity_val_steps=0, **QUIET)
    trainer.fit(model)
    acc = float(trainer.callback_metrics["val/acc"])
    assert model.seen_in_hooks["val"] == pytest.approx(acc) and acc > 0
    assert float(trainer.callback_metrics["val/acc_best"]) == pytest.approx(acc)


def test_metric_compute_in_train_epoch_end_gives_the_epoch_value():
    pytest.importorskip("torchmetrics")
    model = TemplateModel()
    trainer = Trainer(max_epochs=1, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    assert model.seen_in_hooks["train"] == pytest.approx(float(trainer.callback_metrics["train/acc"]))


def test_logged_metrics_are_reset_after_the_epoch_end_hooks():
    pytest.importorskip("torchmetrics")
    model = TemplateModel()
    Trainer(max_epochs=1, num_sanity_val_steps=0, **QUIET).fit(model)
    assert int(model.val_acc.update_count) == 0 and int(model.train_acc.update_count) == 0


def test_a_metric_logged_in_training_and_read_in_the_next_epoch_starts_fresh():
    pytest.importorskip("torchmetrics")

    class CountsUpdates(TemplateModel):
        def on_train_epoch_start(self) -> None:
            self.seen_in_hooks[f"updates_at_epoch_{self.current_epoch}"] = int(self.train_acc.update_count)

    model = CountsUpdates()
    Trainer(max_epochs=2, limit_val_batches=0, **QUIET).fit(model)
    assert model.seen_in_hooks["updates_at_epoch_1"] == 0


def test_log_outside_a_trainer_names_the_fix():
    with pytest.raises(MisconfigurationError, match="needs an attached Trainer"):
        BoringModel().log("x", 1.0)




@pytest.mark.parametrize(("reduce_fx", "expected"), [(min, 0.0), (max, 2.0), ("avg", 1.0), ("SUM", 3.0)])
def test_reduce_fx_takes_lightnings_spellings(reduce_fx: Any, expected: float):
    class M(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("v", float(batch_idx), reduce_fx=reduce_fx, batch_size=1)

    result = Trainer(limit_val_batches=3, **QUIET).validate(M(), verbose=False)
    assert result == [{"v": expected}]


def test_validate_returns_the_logged_epoch_values_of_each_loader():
    """Lightning's results: the epoch values sent to the loggers (`name_epoch` with on_step, nothing logged with
    logger=False), each in the dict of the loader it was logged for, with or without the loader suffix; a value logged
    in the epoch-end hook in every dict."""

    class M(BoringModel):
        def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            self.log("both", 1.0, on_step=True, on_epoch=True)
            self.log(f"own_{dataloader_idx}", float(dataloader_idx), add_dataloader_idx=False)
            self.log("hidden", 2.0, logger=False)

        def on_validation_epoch_end(self) -> None:
            self.log("at_end", 3.0)

        def val_dataloader(self) -> Any:
            return [super().val_dataloader(), super().val_dataloader()]

    results = Trainer(limit_val_batches=2, **QUIET).validate(M(), verbose=False)
    assert results == [{"both_epoch/dataloader_idx_0": 1.0, "own_0": 0.0, "at_end": 3.0},
                       {"both_epoch/dataloader_idx_1": 1.0, "own_1": 1.0, "at_end": 3.0}]


def test_a_callback_logs_through_the_running_module():
    from callbacks import Callback

    class Logs(Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.log("from_callback", 7.0)
            self.log_dict({"also": 8.0})

    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, callbacks=[Logs()], **QUIET)
    trainer.fit(BoringModel())
    assert {k: float(v) for k, v in trainer.callback_metrics.items()} == {"from_callback": 7.0, "also": 8.0}
    assert not hasattr(Logs(), "log")  # attached to the instances of a run, as Lightning does


def test_a_callback_with_its_own_log_method_keeps_it():
    from callbacks import Callback

    class OwnLog(Callback):
        def __init__(self) -> None:
            self.lines: list[str] = []

        def log(self, line: str) -> None:
            self.lines.append(line)

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.log("started")

    callback = OwnLog()
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, callbacks=[callback], **QUIET).fit(BoringModel())
    assert callback.lines == ["started"]


def test_the_callback_base_class_has_only_lightnings_members():
    from callbacks import Callback, LambdaCallback

    hooks = {name for name in dir(Callback) if not name.startswith("_") and callable(getattr(Callback, name))}
    assert "log" not in hooks and "log_dict" not in hooks
    LambdaCallback(**{name: (lambda *a, **k: None) for name in hooks - {"state_dict", "load_state_dict"}})
