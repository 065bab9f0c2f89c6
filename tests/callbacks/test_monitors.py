"""ThroughputMonitor and DeviceStatsMonitor against Lightning 2.6.6 on the same runs: the same metric names, logged
at the same batches (training rows one step later here: our loggers get `global_step` after the optimizer step,
Lightning's the step before it, for `self.log` values too), samples = batches * batch size; on 2 CPU ranks the
world's rates as well."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import DeviceStatsMonitor, ThroughputMonitor
from callbacks.throughput_monitor import Throughput
from strategies.exceptions import MisconfigurationError
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule
from trainer.loggers import Logger

BATCH, FEATURES = 4, 4
FLAGS = {"enable_progress_bar": False, "enable_model_summary": False, "enable_checkpointing": False,
         "accelerator": "cpu", "devices": 1}


def _loader(n: int = 40, seed: int = 0) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, FEATURES, generator=torch.Generator().manual_seed(seed))),
                      batch_size=BATCH)


class _Body:
    def _build(self) -> None:
        torch.manual_seed(0)
        self.layer = nn.Linear(FEATURES, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).sum()
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("v", self.layer(batch[0]).sum())

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("t", self.layer(batch[0]).sum())

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Net(_Body, TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self._build()


class Recorder(Logger):
    """Keeps every (step, metrics) the Trainer sends."""

    name, version = "recorder", 0

    def __init__(self) -> None:
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def log_hyperparams(self, params: Any) -> None:
        pass


def _lightning_parts() -> tuple[Any, type, type]:
    lightning = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.loggers import Logger as LightningLogger

    class LightningRecorder(LightningLogger):
        name, version = "recorder", 0

        def __init__(self) -> None:
            super().__init__()
            self.rows: list[tuple[int | None, dict[str, float]]] = []

        def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
            self.rows.append((step, dict(metrics)))

        def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
            pass

    class Theirs(_Body, lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self._build()

    return lightning, LightningRecorder, Theirs


def _throughput_rows(rows: list[tuple[int | None, dict[str, float]]]) -> list[tuple[str, int, tuple[str, ...]]]:
    """(stage, step, names) of the rows ThroughputMonitor logged, in order; steps of training rows as logged."""
    out = []
    for step, metrics in rows:
        stages = {key.split("/", 1)[0] for key in metrics if "/" in key}
        if stages:
            assert step is not None and len(stages) == 1
            out.append((stages.pop(), step, tuple(sorted(metrics))))
    return out


def _check_counts(rows: list[tuple[int | None, dict[str, float]]]) -> None:
    for _, metrics in rows:
        for stage in ("train", "validate", "test", "predict"):
            if f"{stage}/batches" in metrics:
                assert metrics[f"{stage}/samples"] == metrics[f"{stage}/batches"] * BATCH
                assert metrics[f"{stage}/lengths"] == metrics[f"{stage}/samples"] * FEATURES


def _monitor(cls: type) -> Any:
    return cls(batch_size_fn=lambda batch: batch[0].size(0), length_fn=lambda batch: batch[0].numel(), window_size=3)


def _run(trainer: Any, model: Any) -> None:
    trainer.fit(model, _loader(), _loader(seed=1))
    trainer.validate(model, _loader(seed=1), verbose=False)
    trainer.test(model, _loader(seed=2), verbose=False)
    trainer.predict(model, _loader(seed=3))


@pytest.mark.parametrize("accumulate", [1, 2])
def test_throughput_monitor_logs_lightnings_names_at_lightnings_batches(accumulate: int):
    lightning, LightningRecorder, Theirs = _lightning_parts()
    from lightning.pytorch.callbacks import ThroughputMonitor as LightningThroughputMonitor

    flags = {**FLAGS, "max_epochs": 2, "log_every_n_steps": 2, "limit_val_batches": 3, "val_check_interval": 4,
             "accumulate_grad_batches": accumulate}
    ours, theirs = Recorder(), LightningRecorder()
    _run(Trainer(**flags, logger=ours, callbacks=[_monitor(ThroughputMonitor)]), Net())
    _run(lightning.Trainer(**flags, logger=theirs, callbacks=[_monitor(LightningThroughputMonitor)]), Theirs())
    expected = _throughput_rows(theirs.rows)
    assert _throughput_rows(ours.rows) == expected
    logged = {name for *_, names in expected for name in names}
    assert {"train/device/samples_per_sec", "validate/time", "test/lengths", "predict/samples"} <= logged
    _check_counts(ours.rows)
    batches = [m["train/batches"] for _, m in ours.rows if "train/batches" in m]
    assert batches == [m["train/batches"] for _, m in theirs.rows if "train/batches" in m]


def test_training_rows_share_the_step_of_the_modules_own_values():
    logger = Recorder()
    Trainer(**FLAGS, max_epochs=1, log_every_n_steps=2, logger=logger,
            callbacks=[_monitor(ThroughputMonitor)]).fit(Net(), _loader())
    loss_steps = [step for step, m in logger.rows if "loss" in m]
    assert [step for stage, step, _ in _throughput_rows(logger.rows)] == loss_steps == [1, 3, 5, 7, 9]


def _rank(rank: int, framework: str) -> list[tuple[str, int, tuple[str, ...]]]:
    flags = {**FLAGS, "devices": 2, "strategy": "ddp", "max_steps": 6, "log_every_n_steps": 2}
    monitor = {"batch_size_fn": lambda batch: batch[0].size(0), "window_size": 2}
    if framework == "lightning":
        lightning, LightningRecorder, Theirs = _lightning_parts()
        from lightning.pytorch.callbacks import ThroughputMonitor as LightningThroughputMonitor

        theirs = LightningRecorder()
        lightning.Trainer(**flags, logger=theirs, callbacks=[LightningThroughputMonitor(**monitor)]).fit(
            Theirs(), _loader(64))
        return _throughput_rows(theirs.rows)
    ours = Recorder()
    Trainer(**flags, logger=ours, callbacks=[ThroughputMonitor(**monitor)]).fit(Net(), _loader(64))
    return _throughput_rows(ours.rows)


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_two_ranks_log_the_worlds_rates_as_lightning_does():
    pytest.importorskip("lightning.pytorch")
    ours = run_distributed(_rank, "ours", timeout=90)
    theirs = run_distributed(_rank, "lightning", timeout=90)
    assert ours == theirs
    assert ours[1] == []  # only global rank 0 measures and logs
    assert {"train/samples_per_sec", "train/batches_per_sec", "train/device/samples_per_sec"} <= set(ours[0][-1][2])


def test_throughput_rates_over_the_window():
    throughput = Throughput(world_size=2, window_size=3)
    for i in range(1, 5):
        throughput.update(time=float(i), batches=i, samples=4 * i, lengths=40 * i, flops=100.0)
    metrics = throughput.compute()
    assert metrics["device/batches_per_sec"] == 1.0 and metrics["batches_per_sec"] == 2.0
    assert metrics["device/samples_per_sec"] == 4.0 and metrics["items_per_sec"] == 80.0
    assert metrics["device/flops_per_sec"] == 100.0 and metrics["flops_per_sec"] == 200.0
    with pytest.raises(ValueError, match="increase"):
        throughput.update(time=4.0, batches=5, samples=20)
    with pytest.raises(TypeError, match="available_flops"):
        ThroughputMonitor(batch_size_fn=len, available_flops=1e12)
    with pytest.raises(ValueError, match="window"):
        ThroughputMonitor(batch_size_fn=len, window_size=1)


def test_flops_per_batch_adds_the_flops_rate():
    class Counted(Net):
        flops_per_batch = 1000

    logger = Recorder()
    monitor = ThroughputMonitor(batch_size_fn=lambda b: b[0].size(0), window_size=2)
    Trainer(**FLAGS, max_steps=4, log_every_n_steps=1, logger=logger, callbacks=[monitor]).fit(Counted(), _loader())
    assert "train/device/flops_per_sec" in logger.rows[-2][1] or "train/device/flops_per_sec" in logger.rows[-1][1]


# --- DeviceStatsMonitor ---------------------------------------------------------------------------------------------
def _device_rows(rows: list[tuple[int | None, dict[str, float]]]) -> list[tuple[int | None, tuple[str, ...]]]:
    return [(step, tuple(sorted(m))) for step, m in rows if any(k.startswith("DeviceStatsMonitor.") for k in m)]


def test_device_stats_monitor_logs_lightnings_keys_on_cpu():
    pytest.importorskip("psutil")
    lightning, LightningRecorder, Theirs = _lightning_parts()
    from lightning.pytorch.callbacks import DeviceStatsMonitor as LightningDeviceStatsMonitor

    flags = {**FLAGS, "max_epochs": 1, "log_every_n_steps": 2, "limit_val_batches": 3, "val_check_interval": 4}
    ours, theirs = Recorder(), LightningRecorder()
    _run(Trainer(**flags, logger=ours, callbacks=[DeviceStatsMonitor()]), Net())
    _run(lightning.Trainer(**flags, logger=theirs, callbacks=[LightningDeviceStatsMonitor()]), Theirs())
    ours_rows, their_rows = _device_rows(ours.rows), _device_rows(theirs.rows)
    assert [names for _, names in ours_rows] == [names for _, names in their_rows]
    keys = {k for _, names in ours_rows for k in names}
    assert {"DeviceStatsMonitor.on_train_batch_start/cpu_percent",
            "DeviceStatsMonitor.on_train_batch_end/cpu_vm_percent",
            "DeviceStatsMonitor.on_validation_batch_end/cpu_swap_percent",
            "DeviceStatsMonitor.on_test_batch_start/cpu_percent"} <= keys
    for (step, names), (their_step, _) in zip(ours_rows, their_rows, strict=True):
        assert step is not None and their_step is not None
        if any(".on_train_batch_start/" in name for name in names):
            assert step == their_step  # before the optimizer step both log the steps taken so far
        else:  # after it (and in validation inside fit) our loggers get the step just taken, Lightning's the one before
            assert step - their_step in (0, 1)


def test_device_stats_monitor_needs_a_logger_as_in_lightning():
    with pytest.raises(MisconfigurationError, match="logger"):
        Trainer(**{**FLAGS, "logger": False}, max_steps=1, callbacks=[DeviceStatsMonitor()]).fit(Net(), _loader())


def test_cpu_stats_false_logs_nothing_on_cpu():
    logger = Recorder()
    Trainer(**FLAGS, max_steps=4, log_every_n_steps=1, logger=logger,
            callbacks=[DeviceStatsMonitor(cpu_stats=False)]).fit(Net(), _loader())
    assert _device_rows(logger.rows) == []


def test_setting_available_flops_logs_the_model_flops_utilisation():
    class Counted(Net):
        flops_per_batch = 1000.0

    logger, monitor = Recorder(), _monitor(ThroughputMonitor)
    monitor.available_flops = 1e6  # Lightning fills it from a table of GPU peaks; here the user gives it
    Trainer(**FLAGS, max_epochs=1, log_every_n_steps=2, logger=logger, callbacks=[monitor]).fit(Counted(), _loader())
    rates = [m for _, m in logger.rows if "train/device/mfu" in m]
    assert rates and all(m["train/device/mfu"] == pytest.approx(m["train/device/flops_per_sec"] / 1e6) for m in rates)
