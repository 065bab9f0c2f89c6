"""The LightningDataModule names as Lightning documents them: `setup` / `teardown` with the stage, the loader hooks
used over the module's, `state_dict` / `load_state_dict` through checkpoints, `hparams` sent to the loggers, and
`name`. (`prepare_data`, `on_exception`: test_prepare_data.py; the transfer hooks: test_batch_transfer.py;
`from_datasets`: test_module_methods.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from tests.helpers.boring import QUIET, BoringModel, RandomDataset
from trainer import DataModule, Trainer
from trainer.loggers import Logger


class Data(DataModule):
    def __init__(self, batch_size: int = 4) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.save_hyperparameters()  # only what this records reaches the loggers (hparams set by hand do not)
        self.epochs_seen = 0

    def setup(self, stage: str) -> None:
        self.calls.append(f"setup:{stage.value}")  # a TrainerFn, as in Lightning

    def teardown(self, stage: str) -> None:
        self.calls.append(f"teardown:{stage.value}")

    def train_dataloader(self) -> Any:
        self.calls.append("train_dataloader")
        return DataLoader(RandomDataset(32, 8), batch_size=self.hparams.batch_size)

    def val_dataloader(self) -> Any:
        self.calls.append("val_dataloader")
        return DataLoader(RandomDataset(32, 8), batch_size=self.hparams.batch_size)

    def test_dataloader(self) -> Any:
        self.calls.append("test_dataloader")
        return DataLoader(RandomDataset(32, 8), batch_size=self.hparams.batch_size)

    def predict_dataloader(self) -> Any:
        self.calls.append("predict_dataloader")
        return DataLoader(RandomDataset(32, 8), batch_size=self.hparams.batch_size)

    def state_dict(self) -> dict[str, Any]:
        return {"epochs_seen": self.epochs_seen + 7}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epochs_seen = state_dict["epochs_seen"]


def test_setup_teardown_and_loader_hooks_of_every_entry_point():
    data, model = Data(), BoringModel()
    trainer = Trainer(max_epochs=1, num_sanity_val_steps=0, **QUIET)
    trainer.fit(model, datamodule=data)
    trainer.validate(model, datamodule=data)
    trainer.test(model, datamodule=data)
    trainer.predict(model, datamodule=data)
    assert data.calls == ["setup:fit", "train_dataloader", "val_dataloader", "teardown:fit",
                          "setup:validate", "val_dataloader", "teardown:validate",
                          "setup:test", "test_dataloader", "teardown:test",
                          "setup:predict", "predict_dataloader", "teardown:predict"]


def test_state_dict_is_saved_in_checkpoints_and_loaded_back(tmp_path: Path):
    trainer = Trainer(max_epochs=1, limit_val_batches=0, **QUIET)
    trainer.fit(BoringModel(), datamodule=Data())
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    restored = Data()
    Trainer(max_epochs=2, limit_val_batches=0, **QUIET).fit(BoringModel(), datamodule=restored,
                                                            ckpt_path=tmp_path / "c.ckpt")
    assert restored.epochs_seen == 7


class Remembers(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.params: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return "remembers"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        return None

    def log_hyperparams(self, params: dict[str, Any]) -> None:
        self.params.update(params)


def test_hparams_reach_the_loggers():
    logger = Remembers()
    Trainer(max_epochs=1, limit_val_batches=0, **{**QUIET, "logger": logger}).fit(BoringModel(), datamodule=Data())
    assert logger.params == {"batch_size": 4}


def test_from_datasets_hands_batch_size_and_num_workers_to_an_init_taking_kwargs():
    class Kwargs(DataModule):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__()
            self.given = kwargs

    data = Kwargs.from_datasets(RandomDataset(32, 8), batch_size=4, num_workers=0, other=1)
    assert data.given == {"batch_size": 4, "num_workers": 0, "other": 1}


def test_hparams_from_an_omegaconf_config_compare_equal_to_it():
    from omegaconf import OmegaConf

    class FromConfig(DataModule):
        def __init__(self, config: Any, name: str) -> None:
            super().__init__()
            self.save_hyperparameters(config)

    config = OmegaConf.create({"hello": "world", "size": 3})
    data = FromConfig(config, "foo")
    assert data.hparams == config and config == data.hparams and not data.hparams != config  # Lightning keeps it
    assert data.hparams != OmegaConf.create({"hello": "there", "size": 3})
    assert data.hparams == {"hello": "world", "size": 3} and data.hparams.hello == "world"
