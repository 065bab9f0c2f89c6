"""Several training loaders read together resume bit-exactly: from a checkpoint taken mid-epoch (inside a pass of the
shorter loader) and at an epoch end, the resumed run sees the same batches and ends with the same weights as the
uninterrupted one, with shuffling from the global RNG and from a loader's own generator."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import ModelCheckpoint
from tests.helpers.boring import QUIET
from trainer import CombinedLoader, Trainer, TrainModule, seed_everything


def _data(n: int, offset: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(offset)
    return TensorDataset(torch.arange(offset, offset + n), torch.randn(n, 4, generator=gen))


class Net(TrainModule):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.layer = torch.nn.Sequential(torch.nn.Dropout(0.3), torch.nn.Linear(4, 1))  # draws between fetches
        self.seen: list[Any] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        self.seen.append({k: None if v is None else v[0].tolist() for k, v in batch.items()})
        return sum(self.layer(v[1]).pow(2).mean() for v in batch.values() if v is not None)

    def train_dataloader(self) -> Any:
        loaders = {"a": DataLoader(_data(12, 0), batch_size=2, shuffle=True),
                   "b": DataLoader(_data(5, 100), batch_size=2, shuffle=True,
                                   generator=torch.Generator().manual_seed(3)),
                   "c": DataLoader(_data(4, 200), batch_size=2, shuffle=True)}  # restarts twice an epoch
        return loaders if self.mode == "dict" else CombinedLoader(loaders, self.mode)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _fit(root: Path, mode: str, ckpt: Path | None = None, save_every: int | None = None) -> Net:
    seed_everything(7)
    model = Net(mode)
    callbacks = [ModelCheckpoint(dirpath=root, every_n_train_steps=save_every, save_top_k=-1,
                                 filename="{step}")] if save_every else []
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a resume that cannot replay exactly says so: fail on it
        Trainer(**{**QUIET, "enable_checkpointing": bool(save_every)}, max_epochs=3, callbacks=callbacks,
                default_root_dir=root).fit(model, ckpt_path=ckpt)
    return model


@pytest.mark.parametrize("mode", ["dict", "min_size", "max_size"])
def test_resume_with_several_training_loaders_is_exact(tmp_path: Path, mode: str) -> None:
    reference = _fit(tmp_path / "ref", mode, save_every=1)
    steps_per_epoch = len(reference.seen) // 3
    for step in (steps_per_epoch + 3, steps_per_epoch * 2):  # mid-epoch after a restart of "c", an epoch end
        resumed = _fit(tmp_path / f"resumed{step}", mode, ckpt=tmp_path / "ref" / f"step={step}.ckpt")
        assert resumed.seen == reference.seen[step:]
        assert torch.equal(resumed.layer[1].weight, reference.layer[1].weight)
