"""The checkpoint-facing names of LightningModule and LightningDataModule, as Lightning's docs give them:
`CHECKPOINT_HYPER_PARAMS_KEY` / `_NAME` / `_TYPE` (where the hyperparameters are in a checkpoint),
`remove_ignored_hparams`, `strict_loading`, and `on_load_checkpoint` running before the weights are loaded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from strategies.checkpoint_io.safe_load import safe_load
from strategies.exceptions import CheckpointLoadError, MisconfigurationError
from tests.helpers.boring import QUIET, BoringModel
from trainer import DataModule, Trainer, TrainModule


class Configured(BoringModel):
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.save_hyperparameters(config or {"width": 8})


class Data(DataModule):
    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self) -> Any:
        from tests.helpers.boring import RandomDataset

        return torch.utils.data.DataLoader(RandomDataset(32, 8), batch_size=self.hparams.batch_size)


def _saved(model: TrainModule, path: Path, datamodule: Any = None) -> dict[str, Any]:
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET)
    trainer.fit(model, datamodule=datamodule)
    trainer.save_checkpoint(path)
    return safe_load(path)


def test_checkpoint_hyper_params_key_and_name_are_where_the_hparams_are(tmp_path: Path):
    saved = _saved(Configured({"width": 8}), tmp_path / "a.ckpt", Data())
    assert saved[Configured.CHECKPOINT_HYPER_PARAMS_KEY] == {"width": 8}
    assert saved[Configured.CHECKPOINT_HYPER_PARAMS_NAME] == "config"
    assert saved[Data.CHECKPOINT_HYPER_PARAMS_KEY] == {"batch_size": 4}
    assert Data.CHECKPOINT_HYPER_PARAMS_NAME == "datamodule_hparams_name"


def test_checkpoint_hyper_params_type_is_never_written_hparams_stay_a_plain_dict(tmp_path: Path):
    saved = _saved(Configured(), tmp_path / "a.ckpt", Data())
    assert Configured.CHECKPOINT_HYPER_PARAMS_TYPE == "hparams_type"
    assert Configured.CHECKPOINT_HYPER_PARAMS_TYPE not in saved
    assert Data.CHECKPOINT_HYPER_PARAMS_TYPE not in saved
    assert type(saved[Configured.CHECKPOINT_HYPER_PARAMS_KEY]) is dict


class Base(BoringModel):
    def __init__(self, width: int = 4, backbone: str = "mlp") -> None:
        super().__init__()
        self.save_hyperparameters()


class Derived(Base):
    def __init__(self, width: int = 4) -> None:
        super().__init__(width=width)
        self.remove_ignored_hparams(["backbone"])


def test_remove_ignored_hparams_drops_what_a_base_class_recorded(tmp_path: Path):
    model = Derived()
    assert dict(model.hparams) == {"width": 4}
    assert _saved(model, tmp_path / "d.ckpt")["hparams"] == {"width": 4}
    model.remove_ignored_hparams(["not-there"])  # a missing name is not an error
    data = Data()
    data.remove_ignored_hparams(["batch_size"])
    assert dict(data.hparams) == {} and dict(data.hparams_initial) == {"batch_size": 4}


class Renamed(BoringModel):
    """Its weights were saved as `net.*` by an earlier version; on_load_checkpoint renames them back."""

    def __init__(self) -> None:
        super().__init__()
        self.net = self.layer
        del self.layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["state_dict"]
        for key in [k for k in state if k.startswith("layer.")]:
            state["net." + key[len("layer."):]] = state.pop(key)


def test_on_load_checkpoint_runs_before_the_weights_are_loaded(tmp_path: Path):
    old = BoringModel()
    path = tmp_path / "old.ckpt"
    _saved(old, path)
    assert torch.equal(Renamed.load_from_checkpoint(path).net.weight, old.layer.weight)
    resumed = Renamed()
    Trainer(max_epochs=2, limit_train_batches=1, limit_val_batches=0, **QUIET).fit(resumed, ckpt_path=path)


class Extra(BoringModel):
    """A head the checkpoint does not have: loading needs strict_loading = False."""

    def __init__(self, strict: bool | None = None) -> None:
        super().__init__()
        self.head = nn.Linear(2, 2)
        if strict is not None:
            self.strict_loading = strict

    def configure_optimizers(self) -> Any:  # the saved optimizer state covers the saved weights only
        return torch.optim.SGD(self.layer.parameters(), lr=0.1)


def test_strict_loading_decides_how_checkpoint_weights_are_loaded(tmp_path: Path):
    path = tmp_path / "plain.ckpt"
    plain = BoringModel()
    _saved(plain, path)
    assert Extra().strict_loading is True
    with pytest.raises(CheckpointLoadError, match="head"):
        Extra.load_from_checkpoint(path)
    loose = Extra.load_from_checkpoint(path, strict=False)
    assert torch.equal(loose.layer.weight, plain.layer.weight)
    with pytest.raises(CheckpointLoadError, match="head"):
        Trainer(max_epochs=2, limit_train_batches=1, limit_val_batches=0, **QUIET).fit(Extra(), ckpt_path=path)
    model = Extra(strict=False)
    Trainer(max_epochs=2, limit_train_batches=1, limit_val_batches=0, **QUIET).fit(model, ckpt_path=path)
    assert model.trainer.current_epoch == 2


class LooseExtra(Extra):
    def __init__(self) -> None:
        super().__init__(strict=False)


def test_strict_loading_set_in_init_and_a_contradicting_strict_argument_is_an_error(tmp_path: Path):
    path = tmp_path / "plain.ckpt"
    _saved(BoringModel(), path)
    with pytest.raises(MisconfigurationError, match="strict_loading=False"):
        LooseExtra.load_from_checkpoint(path, strict=True)
    assert LooseExtra.load_from_checkpoint(path).strict_loading is False
    assert LooseExtra.load_from_checkpoint(path, strict=False).strict_loading is False
