"""SpikeDetection: a loss that jumps away from its recent mean stops training with TrainingSpikeException at the same
batch as Lightning's callback, and the same suspect batches go to the JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import SpikeDetection, TrainingSpikeException
from tests.helpers.boring import QUIET, BoringModel, RandomDataset
from trainer import Trainer

LOSSES = [1.0, 0.9, 0.8, 0.85, 0.7, 9.0, 0.6, 0.5]  # batch 5 is a spike; batch 3 is worse but close to the mean


def _loss(layer: torch.nn.Module, batch: Any, batch_idx: int) -> torch.Tensor:
    out = layer(batch).sum() * 0.0  # a graph to backward through, with the loss the list gives
    return out + LOSSES[batch_idx]


class Spiky(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        return _loss(self.layer, batch, batch_idx)


def _lightnings(path: Path, **options: Any) -> tuple[type[BaseException], list[int]]:
    pl = pytest.importorskip("lightning.pytorch")

    class Theirs(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 2)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return _loss(self.layer, batch, batch_idx)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.0)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(RandomDataset(32, 64), batch_size=8)

    trainer = pl.Trainer(callbacks=[pl.callbacks.SpikeDetection(exclude_batches_path=path, **options)], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         max_epochs=1, accelerator="cpu", devices=1, limit_val_batches=0)
    with pytest.raises(BaseException) as raised:
        trainer.fit(Theirs())
    return type(raised.value), json.loads(path.read_text())


def test_a_spike_stops_training_at_lightnings_batch(tmp_path: Path):
    callback = SpikeDetection(exclude_batches_path=tmp_path / "ours.json", window=3)
    with pytest.raises(TrainingSpikeException, match="Training spike detected in batch 5"):
        Trainer(max_epochs=1, limit_val_batches=0, callbacks=[callback], **QUIET).fit(Spiky())
    assert callback.bad_batches == [4, 5] and json.loads((tmp_path / "ours.json").read_text()) == [4, 5]
    kind, written = _lightnings(tmp_path / "theirs.json", window=3)
    assert kind.__name__ == "TrainingSpikeException" and written == [4, 5]


def test_a_loose_tolerance_lets_the_run_finish_and_the_default_file_is_in_the_root_dir(tmp_path: Path):
    callback = SpikeDetection(rtol=20.0)
    Trainer(max_epochs=1, limit_val_batches=0, default_root_dir=tmp_path, callbacks=[callback], **QUIET).fit(Spiky())
    assert callback.bad_batches == [] and not (tmp_path / "skip_batches.json").exists()
    stopped = SpikeDetection()
    with pytest.raises(TrainingSpikeException):
        Trainer(max_epochs=1, limit_val_batches=0, default_root_dir=tmp_path, callbacks=[stopped],
                **QUIET).fit(Spiky())
    assert json.loads((tmp_path / "skip_batches.json").read_text()) == [4, 5]


@pytest.mark.parametrize(("package", "name"), [("callbacks", "ModelPruning"), ("trainer.loggers", "CometLogger"),
                                               ("trainer.loggers", "NeptuneLogger")])
def test_lightnings_callbacks_and_loggers_without_a_counterpart_are_refused_by_name(package: str, name: str):
    """A port's `from callbacks import ModelPruning` fails at once with what to use instead (the import table)."""
    with pytest.raises(ImportError, match=f"Lightning's {name} has no counterpart here"):
        exec(f"from {package} import {name}", {})
