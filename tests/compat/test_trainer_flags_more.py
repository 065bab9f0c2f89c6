"""Lightning 2.x's Trainer flags `overfit_batches`, `val_check_interval` as a time, `barebones`, and
`log_every_n_steps` counted in optimizer steps, with Lightning 2.6 run beside ours as the oracle."""

from __future__ import annotations

import csv
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET
from tests.helpers.dist import run_distributed
from trainer import Trainer, TrainModule

LIGHTNING_QUIET = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                   "enable_model_summary": False, "accelerator": "cpu", "devices": 1}


class _Body:
    """Records the sample ids each epoch trains and validates on; logs the loss."""

    def _build(self) -> None:
        torch.manual_seed(0)
        self.net = nn.Linear(4, 1)
        self.seen: dict[str, list[list[int]]] = {"train": [], "val": []}
        self.val_at: list[int] = []
        self.stop_from: int | None = None  # set should_stop from this global step on

    def on_train_epoch_start(self) -> None:
        self.seen["train"].append([])

    def on_validation_epoch_start(self) -> None:
        self.seen["val"].append([])
        self.val_at.append(self.trainer.global_step)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.stop_from is not None and self.trainer.global_step >= self.stop_from:
            self.trainer.should_stop = True
        ids, x = batch
        self.seen["train"][-1].extend(ids.tolist())
        loss = self.net(x).pow(2).mean()
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.seen["val"][-1].extend(batch[0].tolist())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Net(_Body, TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self._build()


def _lightning() -> tuple[Any, Any]:
    lightning = pytest.importorskip("lightning.pytorch")

    class Theirs(_Body, lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self._build()

    return lightning, Theirs()


def _loader(n: int = 40, shuffle: bool = True) -> DataLoader:
    data = TensorDataset(torch.arange(n), torch.randn(n, 4, generator=torch.Generator().manual_seed(1)))
    return DataLoader(data, batch_size=4, shuffle=shuffle, generator=torch.Generator().manual_seed(2))


# --- overfit_batches ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("overfit", [3, 0.25])
def test_overfit_batches_sees_lightnings_batches(overfit: int | float):
    lightning, theirs = _lightning()
    flags = {"max_epochs": 3, "overfit_batches": overfit, "limit_train_batches": 7, "num_sanity_val_steps": 0}
    with pytest.warns(UserWarning, match="turning off the train dataloader shuffling"):
        lightning.Trainer(**flags, **LIGHTNING_QUIET).fit(theirs, _loader(), _loader())
    ours = Net()
    with pytest.warns(UserWarning, match="turning off the train dataloader shuffling"):
        Trainer(**flags, **QUIET).fit(ours, _loader(), _loader())
    assert ours.seen == theirs.seen
    assert ours.seen["train"][0] == ours.seen["train"][-1] == list(range(len(ours.seen["train"][0])))


def _overfit_ids_on_a_rank(rank: int) -> dict[str, list[list[int]]]:
    model = Net()
    Trainer(max_epochs=2, overfit_batches=2, num_sanity_val_steps=0, **{**QUIET, "devices": 2, "strategy": "ddp"}
            ).fit(model, _loader(), _loader())
    return model.seen


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_overfit_batches_under_ddp_shards_in_order():
    """As Lightning's DistributedSampler with shuffle off: rank r takes samples r, r+2, ... every epoch."""
    rank0, rank1 = run_distributed(_overfit_ids_on_a_rank)
    assert rank0["train"] == [[0, 2, 4, 6, 8, 10, 12, 14]] * 2 and rank1["train"] == [[1, 3, 5, 7, 9, 11, 13, 15]] * 2
    assert rank0["val"] == [[0, 2, 4, 6, 8, 10, 12, 14]] * 2


def test_overfit_batches_is_checked_as_a_batch_limit():
    with pytest.raises(ConfigError, match="overfit_batches"):
        Trainer(overfit_batches=1.5, **QUIET)


# --- val_check_interval as a time ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("given", "seconds"), [("00:01:02:03", 3723), ({"minutes": 30}, 1800),
                                                (timedelta(seconds=5), 5)])
def test_a_time_interval_is_read_as_lightning_reads_it(given: Any, seconds: float):
    assert Trainer(val_check_interval=given, **QUIET).val_check_interval == timedelta(seconds=seconds)


def test_a_bad_time_interval_names_the_flag():
    with pytest.raises(ConfigError, match="val_check_interval"):
        Trainer(val_check_interval="1:2:3", **QUIET)


class _Clock:
    """A fake monotonic clock: each training batch takes 1 s."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Timed(Net):
    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.clock = clock

    def on_train_batch_end(self, *args: Any) -> None:
        self.clock.now += 1.0


def test_validation_runs_when_the_interval_has_passed():
    clock = _Clock()
    model = Timed(clock)
    trainer = Trainer(max_epochs=2, val_check_interval={"seconds": 3}, num_sanity_val_steps=0, **QUIET)
    trainer.fit_state.schedule.clock = clock
    trainer.fit(model, _loader(shuffle=False), _loader(8, shuffle=False))
    # 10 batches an epoch, 1 s each: every 3rd batch, counted from the last validation, across epochs, and not
    # at the end of an epoch by itself
    assert model.val_at == [3, 6, 9, 12, 15, 18]


def test_validation_by_the_clock_runs_after_lightnings_batches(monkeypatch: pytest.MonkeyPatch):
    """Both loops read time.monotonic; a fake one that advances 1 s per training batch makes the runs comparable."""
    import time

    lightning, _ = _lightning()

    class TimedTheirs(_Body, lightning.LightningModule):
        def __init__(self, clock: _Clock) -> None:
            super().__init__()
            self._build()
            self.clock = clock

        on_train_batch_end = Timed.on_train_batch_end

    runs = []
    for build, make in ((lambda **f: lightning.Trainer(**f, **LIGHTNING_QUIET), TimedTheirs),
                        (lambda **f: Trainer(**f, **QUIET), Timed)):
        clock = _Clock()
        monkeypatch.setattr(time, "monotonic", clock)
        model = make(clock)
        build(max_epochs=3, val_check_interval="00:00:00:4", num_sanity_val_steps=0, check_val_every_n_epoch=1,
              limit_val_batches=1).fit(model, _loader(shuffle=False), _loader(8, shuffle=False))
        runs.append(model.val_at)
    assert runs[0] == runs[1] != []


def test_checkpoints_follow_the_timed_validations_as_in_lightning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Lightning's ModelCheckpoint saves after a timed validation, not at the training epoch's end."""
    import time

    from callbacks import ModelCheckpoint

    lightning, _ = _lightning()

    class TimedTheirs(_Body, lightning.LightningModule):
        def __init__(self, clock: _Clock) -> None:
            super().__init__()
            self._build()
            self.clock = clock

        on_train_batch_end = Timed.on_train_batch_end

    saved = []
    for side, checkpoint, build, make in (
            ("theirs", lightning.callbacks.ModelCheckpoint, lightning.Trainer, TimedTheirs),
            ("ours", ModelCheckpoint, Trainer, Timed)):
        clock = _Clock()
        monkeypatch.setattr(time, "monotonic", clock)
        quiet = {**(LIGHTNING_QUIET if side == "theirs" else QUIET), "enable_checkpointing": True}
        cb = checkpoint(dirpath=tmp_path / side, save_top_k=-1)
        build(max_epochs=2, val_check_interval={"seconds": 7}, num_sanity_val_steps=0, limit_val_batches=1,
              callbacks=[cb], **quiet).fit(make(clock), _loader(shuffle=False), _loader(8, shuffle=False))
        saved.append(sorted(p.name for p in (tmp_path / side).iterdir()))
    assert saved[0] == saved[1] != []


def _val_steps_on_a_rank(rank: int) -> list[int]:
    import time

    class Slow(Net):
        def on_train_batch_end(self, *args: Any) -> None:
            time.sleep(0.03)

    model = Slow()
    trainer = Trainer(max_epochs=1, val_check_interval=timedelta(seconds=0.2), num_sanity_val_steps=0,
                      **{**QUIET, "devices": 2, "strategy": "ddp"})
    if rank == 1:  # rank 1's clock runs twice as fast: alone, it would validate at other batches than rank 0
        trainer.fit_state.schedule.clock = lambda: 2 * time.monotonic()
    trainer.fit(model, _loader(160, shuffle=False), _loader(8))
    return model.val_at


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_ranks_validate_after_the_same_batches():
    rank0, rank1 = run_distributed(_val_steps_on_a_rank)
    assert rank0 == rank1 and len(rank0) >= 2


# --- barebones ----------------------------------------------------------------------------------------------------
ASKED_FOR = [{"enable_checkpointing": True}, {"logger": True}, {"enable_progress_bar": True},
             {"log_every_n_steps": 5}, {"enable_model_summary": True}, {"num_sanity_val_steps": 2},
             {"fast_dev_run": True}, {"detect_anomaly": True}, {"profiler": "simple"}]


@pytest.mark.parametrize("flags", ASKED_FOR)
def test_barebones_refuses_what_lightning_refuses(flags: dict[str, Any]):
    lightning, _ = _lightning()
    name = next(iter(flags))
    with pytest.raises(ValueError, match=f"barebones=True, {name}=") as theirs:
        lightning.Trainer(barebones=True, **flags)
    with pytest.raises(ValueError, match=f"barebones=True, {name}=") as ours:
        Trainer(barebones=True, accelerator="cpu", devices=1, **flags)
    assert isinstance(ours.value, ConfigError) and isinstance(theirs.value, ValueError)


@pytest.mark.parametrize("flags", [{}, {"enable_checkpointing": False, "logger": False, "log_every_n_steps": 0,
                                        "num_sanity_val_steps": 0, "fast_dev_run": False, "profiler": None}])
def test_barebones_accepts_what_lightning_accepts(flags: dict[str, Any]):
    lightning, _ = _lightning()
    lightning.Trainer(barebones=True, **flags)
    trainer = Trainer(barebones=True, accelerator="cpu", devices=1, **flags)
    assert trainer.barebones and trainer.loggers == [] and trainer.callbacks == []
    assert (trainer.log_every_n_steps, trainer.fit_state.spec.num_sanity_val_steps) == (0, 0)


def test_barebones_trains_to_the_weights_of_a_plain_run_and_self_log_warns():
    plain, bare = Net(), Net()
    Trainer(max_epochs=2, **QUIET).fit(plain, _loader(shuffle=False))
    with pytest.warns(UserWarning, match="barebones"):
        Trainer(max_epochs=2, barebones=True, accelerator="cpu", devices=1).fit(bare, _loader(shuffle=False))
    assert torch.equal(plain.net.weight, bare.net.weight) and torch.equal(plain.net.bias, bare.net.bias)


def test_barebones_trains_to_lightnings_weights():
    lightning, theirs = _lightning()
    lightning.Trainer(max_epochs=2, barebones=True, accelerator="cpu", devices=1).fit(theirs, _loader(shuffle=False))
    ours = Net()
    Trainer(max_epochs=2, barebones=True, accelerator="cpu", devices=1).fit(ours, _loader(shuffle=False))
    assert torch.equal(ours.net.weight, theirs.net.weight)


# --- log_every_n_steps in optimizer steps -------------------------------------------------------------------------
def _logged_steps(folder: Path) -> list[int]:
    (path,) = folder.rglob("metrics.csv")
    with path.open() as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get("loss")]


@pytest.mark.parametrize(("accumulate", "every_n"), [(4, 2), (1, 3), (3, 1)])
def test_step_values_reach_the_logger_at_lightnings_steps(tmp_path: Path, accumulate: int, every_n: int):
    lightning, theirs = _lightning()
    from lightning.pytorch.loggers import CSVLogger as TheirCSV

    from trainer.loggers import CSVLogger

    flags = {"max_epochs": 2, "accumulate_grad_batches": accumulate, "log_every_n_steps": every_n}
    quiet = {k: v for k, v in LIGHTNING_QUIET.items() if k != "logger"}
    lightning.Trainer(**flags, **quiet, logger=TheirCSV(tmp_path / "theirs")).fit(theirs, _loader(88, False))
    Trainer(**flags, **quiet, logger=CSVLogger(tmp_path / "ours")).fit(Net(), _loader(88, False))
    assert _logged_steps(tmp_path / "ours") == _logged_steps(tmp_path / "theirs") != []



def test_a_requested_stop_logs_its_steps_as_in_lightning(tmp_path: Path):
    """Lightning also sends step values when should_stop is set (here held back by min_steps for a few steps)."""
    lightning, theirs = _lightning()
    from lightning.pytorch.loggers import CSVLogger as TheirCSV

    from trainer.loggers import CSVLogger

    ours = Net()
    ours.stop_from = theirs.stop_from = 5
    flags = {"max_epochs": 3, "min_steps": 9, "log_every_n_steps": 4, "min_epochs": 0}
    quiet = {k: v for k, v in LIGHTNING_QUIET.items() if k != "logger"}
    lightning.Trainer(**flags, **quiet, logger=TheirCSV(tmp_path / "theirs")).fit(theirs, _loader(88, False))
    Trainer(**flags, **quiet, logger=CSVLogger(tmp_path / "ours")).fit(ours, _loader(88, False))
    assert _logged_steps(tmp_path / "ours") == _logged_steps(tmp_path / "theirs")


class _EpochLogs:
    """Logs a step value, a training epoch value and a validation value."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)  # type: ignore[misc]
        self.log("loss_epoch_mean", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)  # type: ignore[misc]
        self.log("val", batch[1].sum())


def _csv_rows(folder: Path) -> list[tuple[int, list[str]]]:
    (path,) = folder.rglob("metrics.csv")
    with path.open() as f:
        return [(int(row["step"]), sorted(k for k, v in row.items() if v and k not in ("step", "epoch")))
                for row in csv.DictReader(f)]


@pytest.mark.parametrize("flags", [{"accumulate_grad_batches": 2, "val_check_interval": 5, "log_every_n_steps": 2},
                                   {"accumulate_grad_batches": 1, "val_check_interval": 0.5, "log_every_n_steps": 3}])
def test_step_epoch_and_validation_rows_are_lightnings(tmp_path: Path, flags: dict[str, Any]):
    lightning, _ = _lightning()
    from lightning.pytorch.loggers import CSVLogger as TheirCSV

    from trainer.loggers import CSVLogger

    class Theirs(_EpochLogs, _Body, lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self._build()

    class Ours(_EpochLogs, Net):
        pass

    quiet = {k: v for k, v in LIGHTNING_QUIET.items() if k != "logger"}
    lightning.Trainer(max_epochs=2, num_sanity_val_steps=0, **flags, **quiet,
                      logger=TheirCSV(tmp_path / "theirs")).fit(Theirs(), _loader(40, False), _loader(8, False))
    Trainer(max_epochs=2, num_sanity_val_steps=0, **flags, **quiet,
            logger=CSVLogger(tmp_path / "ours")).fit(Ours(), _loader(40, False), _loader(8, False))
    assert _csv_rows(tmp_path / "ours") == _csv_rows(tmp_path / "theirs")
