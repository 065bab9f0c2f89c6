"""TrainModule: hyperparameters, properties, and rebuilding from a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.boring import QUIET, BoringModel
from trainer import Trainer, TrainModule


class HP(BoringModel):
    def __init__(self, width: int = 4, name: str = "x", *, dropout: float = 0.1, **extra: Any) -> None:
        super().__init__()
        self.save_hyperparameters(ignore="name")


def test_save_hyperparameters_records_init_arguments():
    model = HP(8, "y", dropout=0.5, flag=True)
    assert model.hparams == {"width": 8, "dropout": 0.5, "flag": True}
    assert model.hparams.width == 8


def test_save_hyperparameters_with_names_and_dicts():
    class Named(TrainModule):
        def __init__(self, a: int = 1, b: int = 2) -> None:
            super().__init__()
            self.save_hyperparameters("a")

    assert Named(5).hparams == {"a": 5}

    class FromDict(TrainModule):
        def __init__(self, config: dict) -> None:
            super().__init__()
            self.save_hyperparameters(config)

    assert FromDict({"lr": 0.1}).hparams == {"lr": 0.1}


def test_properties_without_and_with_a_trainer():
    model = BoringModel()
    assert (model.global_rank, model.local_rank, model.current_epoch, model.global_step) == (0, 0, 0, 0)
    assert model.device == torch.device("cpu")
    with pytest.raises(RuntimeError, match="is not attached to a Trainer"):
        _ = model.trainer
    trainer = Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    assert model.trainer is trainer and (model.current_epoch, model.global_step) == (2, 4)


def test_load_from_checkpoint_rebuilds_from_hparams(tmp_path: Path):
    model = HP(width=6, dropout=0.3)
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    loaded = HP.load_from_checkpoint(tmp_path / "m.ckpt")
    assert loaded.hparams == {"width": 6, "dropout": 0.3}
    for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert HP.load_from_checkpoint(tmp_path / "m.ckpt", width=9).hparams.width == 9


def test_non_primitive_hparams_are_reported_when_recorded_and_stored_by_repr(tmp_path: Path):
    class Holder(BoringModel):
        def __init__(self, thing: Any) -> None:
            super().__init__()
            self.save_hyperparameters()

    with pytest.warns(UserWarning, match=r"Holder.save_hyperparameters\(\): 1 value\(s\).*'thing': a dict holding"):
        model = Holder(thing={"inner": object()})  # seen here, not after an epoch of training
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET)
    trainer.fit(model)
    trainer.save_checkpoint(tmp_path / "m.ckpt")
    assert torch.load(tmp_path / "m.ckpt", weights_only=True)["hparams"]["thing"]["inner"].startswith("<object")
