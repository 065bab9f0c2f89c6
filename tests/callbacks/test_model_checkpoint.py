"""ModelCheckpoint: default location, latest-only, top-k by a monitored metric, last.ckpt, step cadence."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from callbacks import ModelCheckpoint
from tests.helpers.boring import QUIET, BoringModel
from tests.helpers.owners import dead_owner_tag
from trainer import Trainer
from trainer.exceptions import ConfigError, MisconfigurationError

CKPT = {**QUIET, "enable_checkpointing": True}


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_default_checkpoint_keeps_the_latest_epoch(tmp_path: Path):
    trainer = Trainer(max_epochs=3, default_root_dir=tmp_path, **CKPT)
    trainer.fit(BoringModel())
    assert _names(tmp_path / "checkpoints") == ["epoch=2-step=24.ckpt"]
    assert trainer.checkpoint_callback.best_model_path == str(tmp_path / "checkpoints" / "epoch=2-step=24.ckpt")


class Scored(BoringModel):
    """val_score per epoch: 3, 1, 2, 0."""

    def validation_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("val_score", float([3, 1, 2, 0][self.current_epoch]))


def test_top_k_by_monitored_metric(tmp_path: Path):
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val_score", mode="max", save_top_k=2, save_last=True,
                         filename="{epoch}-{val_score:.1f}")
    trainer = Trainer(max_epochs=4, num_sanity_val_steps=0, callbacks=[cb], **CKPT)
    trainer.fit(Scored())
    assert _names(tmp_path) == ["epoch=0-val_score=3.0.ckpt", "epoch=2-val_score=2.0.ckpt", "last.ckpt"]
    assert cb.best_model_score == 3.0 and cb.best_model_path.endswith("epoch=0-val_score=3.0.ckpt")


def test_every_n_train_steps(tmp_path: Path):
    cb = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=5, save_top_k=-1)
    Trainer(max_epochs=2, limit_val_batches=0, callbacks=[cb], **CKPT).fit(BoringModel())
    assert _names(tmp_path) == ["epoch=0-step=5.ckpt", "epoch=1-step=10.ckpt", "epoch=1-step=15.ckpt"]


def test_train_time_interval(tmp_path: Path):
    cb = ModelCheckpoint(dirpath=tmp_path, train_time_interval=timedelta(seconds=0), save_top_k=-1)
    Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0, callbacks=[cb], **CKPT).fit(BoringModel())
    assert _names(tmp_path) == ["epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt", "epoch=0-step=3.ckpt"]


def test_ckpt_path_last_ignores_temp_files_of_an_interrupted_save(tmp_path: Path):
    cb = ModelCheckpoint(dirpath=tmp_path)
    Trainer(max_epochs=1, limit_val_batches=0, callbacks=[cb], **CKPT).fit(BoringModel())
    (tmp_path / f"epoch=5-step=99.ckpt.tmp-{dead_owner_tag()}").write_bytes(b"partial")
    resumed = ModelCheckpoint(dirpath=tmp_path)
    trainer = Trainer(max_epochs=2, limit_val_batches=0, callbacks=[resumed], **CKPT)
    trainer.fit(BoringModel(), ckpt_path="last")
    assert trainer.global_step == 16 and not list(tmp_path.glob("*.tmp-*"))


def test_missing_monitor_names_the_logged_metrics(tmp_path: Path):
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val_acc")
    with pytest.raises(MisconfigurationError, match=r"monitor='val_acc'\) found no such metric.*\['val_loss'\]"):
        Trainer(max_epochs=1, callbacks=[cb], **CKPT).fit(BoringModel())


def test_bad_arguments():
    with pytest.raises(ConfigError, match="mode='best'"):
        ModelCheckpoint(mode="best")
    with pytest.raises(ConfigError, match="save_top_k=3, monitor=None\\) is not a valid configuration"):
        ModelCheckpoint(save_top_k=3)
    with pytest.raises(ConfigError, match="enable_checkpointing=False"):
        Trainer(callbacks=[ModelCheckpoint()], enable_checkpointing=False)


def test_checkpoint_callback_state_survives_resume(tmp_path: Path):
    cb = ModelCheckpoint(dirpath=tmp_path, monitor="val_score", mode="max", save_top_k=2)
    Trainer(max_epochs=2, num_sanity_val_steps=0, callbacks=[cb], **CKPT).fit(Scored())
    resumed = ModelCheckpoint(dirpath=tmp_path, monitor="val_score", mode="max", save_top_k=2)
    Trainer(max_epochs=3, num_sanity_val_steps=0, callbacks=[resumed], **CKPT).fit(
        Scored(), ckpt_path=cb.best_model_path
    )
    assert sorted(resumed.best_k_models.values()) == [2.0, 3.0]
    # epoch=1-step=16.ckpt was written by the first run after the resumed checkpoint: the resumed run does not know
    # it, so it saved its own epoch 1 as epoch=1-step=16-v1.ckpt (as Lightning does) and evicted that, not the other
    assert _names(tmp_path) == ["epoch=0-step=8.ckpt", "epoch=1-step=16.ckpt", "epoch=2-step=24.ckpt"]
