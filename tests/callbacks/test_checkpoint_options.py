"""ModelCheckpoint's `enable_version_counter`, `save_last="link"` and `save_on_exception`, with the files Lightning
2.6 writes for the same run as the oracle."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks import ModelCheckpoint
from strategies.exceptions import ConfigError
from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer

FLAGS = {**QUIET, "enable_checkpointing": True, "max_epochs": 1, "limit_val_batches": 0}


class Fails(BoringModel):
    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if batch_idx == 3:
            raise RuntimeError("a bug in step 3")
        return super().training_step(batch, batch_idx)


def _ours(folder: Path, model: Any = None, **options: Any) -> list[str]:
    callback = ModelCheckpoint(dirpath=folder, **options)
    try:
        Trainer(callbacks=[callback], **FLAGS).fit(model or BoringModel())
    except RuntimeError:
        pass
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


def _lightnings(folder: Path, model_class: type, **options: Any) -> list[str]:
    lightning = pytest.importorskip("lightning.pytorch")

    class Theirs(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model_class()

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.inner.training_step(batch, batch_idx)

        def train_dataloader(self) -> Any:
            return self.inner.train_dataloader()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = lightning.callbacks.ModelCheckpoint(dirpath=folder, **options)
    trainer = lightning.Trainer(callbacks=[callback], logger=False, enable_progress_bar=False,
                                enable_model_summary=False, accelerator="cpu", devices=1, max_epochs=1,
                                limit_val_batches=0)
    try:
        trainer.fit(Theirs())
    except RuntimeError:
        pass
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


CASES = [
    {"filename": "{epoch}", "every_n_train_steps": 2, "save_top_k": -1},
    {"filename": "{epoch}", "every_n_train_steps": 2, "save_top_k": -1, "enable_version_counter": False},
    {"filename": "{epoch}", "every_n_train_steps": 2, "save_top_k": 3, "monitor": "step"},
    {"filename": "{epoch}", "every_n_train_steps": 2, "save_top_k": 3, "monitor": "step",
     "enable_version_counter": False},
    {"every_n_train_steps": 3, "save_last": "link"},
    {"every_n_train_steps": 2, "save_top_k": -1, "save_last": True},
]


@pytest.mark.parametrize("options", CASES)
def test_the_files_are_lightnings(tmp_path: Path, options: dict[str, Any]):
    ours = _ours(tmp_path / "ours", **options)
    assert ours == _lightnings(tmp_path / "theirs", BoringModel, **options)


def test_a_repeated_name_gets_a_version_unless_asked_to_overwrite(tmp_path: Path):
    options = {"filename": "{epoch}", "every_n_train_steps": 2, "save_top_k": 3, "monitor": "step"}
    assert _ours(tmp_path / "a", **options) == ["epoch=0-v1.ckpt", "epoch=0-v2.ckpt", "epoch=0.ckpt"]
    assert _ours(tmp_path / "b", enable_version_counter=False, **options) == ["epoch=0.ckpt"]


def test_save_last_link_is_a_relative_link_to_the_newest_checkpoint(tmp_path: Path):
    names = _ours(tmp_path, every_n_train_steps=3, save_last="link")
    assert names == ["epoch=0-step=6.ckpt", "last.ckpt"]
    assert (tmp_path / "last.ckpt").is_symlink() and os.readlink(tmp_path / "last.ckpt") == "epoch=0-step=6.ckpt"
    trainer = Trainer(**{**FLAGS, "max_epochs": 2})
    trainer.fit(BoringModel(), ckpt_path=tmp_path / "last.ckpt")  # resumes through the link
    assert trainer.global_step == 16


def test_save_on_exception_saves_where_the_run_failed(tmp_path: Path):
    names = _ours(tmp_path, model=Fails(), save_on_exception=True, save_last=True)
    assert names == ["epoch=0-step=3.ckpt", "last.ckpt"]
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 3


def test_save_on_exception_matches_lightning(tmp_path: Path):
    ours = _ours(tmp_path / "ours", model=Fails(), save_on_exception=True)
    assert ours == _lightnings(tmp_path / "theirs", Fails, save_on_exception=True)


def test_bad_options_are_refused():
    with pytest.raises(ConfigError, match="save_last='copy'"):
        ModelCheckpoint(save_last="copy")  # type: ignore[arg-type]
    callback = ModelCheckpoint(save_on_exception=True)
    with pytest.raises(ConfigError, match="single process"):
        callback.setup(Trainer(devices=2, accelerator="cpu", strategy="ddp"), BoringModel(), "fit")
