"""`prepare_data()` on the module and the DataModule, as Lightning documents it: called before `setup`, once per
machine on local rank 0 (`prepare_data_per_node=True`, the default) or on global rank 0 only (False), while the other
ranks wait; the DataModule's first. Also `configure_model()` (after `setup`) and `DataModule.on_exception`."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.dist import run_distributed
from trainer import DataModule, Trainer


class Data(DataModule):
    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def prepare_data(self) -> None:
        self.calls.append("datamodule.prepare_data")

    def setup(self, stage: str) -> None:
        self.calls.append("datamodule.setup")


class Model(BoringModel):
    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def prepare_data(self) -> None:
        self.calls.append("prepare_data")

    def setup(self, stage: str) -> None:
        self.calls.append("setup")

    def configure_model(self) -> None:
        self.calls.append("configure_model")


def test_prepare_data_runs_before_setup_datamodule_first():
    calls: list[str] = []
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET).fit(Model(calls),
                                                                                  datamodule=Data(calls))
    assert calls == ["datamodule.prepare_data", "prepare_data", "datamodule.setup", "setup", "configure_model"]


def test_configure_model_runs_after_setup_in_every_entry_point():
    calls: list[str] = []
    trainer = Trainer(**QUIET)
    model = Model(calls)
    trainer.validate(model)
    trainer.predict(model)
    assert calls == ["prepare_data", "setup", "configure_model"] * 2


def test_datamodule_on_exception_gets_the_error():
    class Failing(Model):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            raise ValueError("boom")

    class Seen(Data):
        def on_exception(self, exception: BaseException) -> None:
            self.calls.append(f"on_exception:{exception}")

    calls: list[str] = []
    with pytest.raises(ValueError, match="boom"):
        Trainer(max_epochs=1, **QUIET).fit(Failing(calls), datamodule=Seen(calls))
    assert calls[-1] == "on_exception:boom"


class SlowPrepare(BoringModel):
    """prepare_data writes a file slowly; setup on every rank must find it (the other ranks waited)."""

    def __init__(self, folder: str, per_node: bool) -> None:
        super().__init__()
        self.folder = folder
        self.prepare_data_per_node = per_node

    def prepare_data(self) -> None:
        time.sleep(1.0)
        marker = Path(self.folder) / f"prepared-by-{os.getpid()}"
        marker.write_text("done")

    def setup(self, stage: str) -> None:
        self.prepared_before_setup = len(list(Path(self.folder).glob("prepared-by-*")))


def _fit_rank(rank: int, folder: str, per_node: bool) -> int:
    model = SlowPrepare(folder, per_node)
    Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, strategy="ddp", **{**QUIET, "devices": 2}).fit(
        model)
    return model.prepared_before_setup


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("per_node", [True, False])
def test_prepare_data_runs_once_on_rank_zero_and_the_other_rank_waits(tmp_path: Path, per_node: bool):
    seen = run_distributed(_fit_rank, str(tmp_path), per_node)
    assert seen == [1, 1] and len(list(tmp_path.glob("prepared-by-*"))) == 1
