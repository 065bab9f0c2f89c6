"""save_hyperparameters / hparams / hparams_initial / DataModule.save_hyperparameters, as Lightning 2.x documents
them, with one difference we own: values a weights-only checkpoint cannot hold are seen when
`save_hyperparameters()` is called (one warning naming them) and stored by name or repr, never pickled."""

from __future__ import annotations

import argparse
import functools
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from strategies.exceptions import CheckpointLoadError, MisconfigurationError
from tests.helpers.boring import QUIET, BoringModel, RandomDataset
from trainer import DataModule, Trainer, TrainModule


class WithObjects(BoringModel):
    def __init__(self, backbone: nn.Module, activation: type = nn.ReLU, init: Any = torch.nn.init.zeros_,
                 optimizer: Any = functools.partial(torch.optim.SGD, lr=0.1), lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.backbone = backbone


class Plain(BoringModel):
    def __init__(self, width: int = 4, tags: tuple[str, ...] = ("a",), scale: float = 1.0) -> None:
        super().__init__()
        self.save_hyperparameters()


def _fit_and_save(model: TrainModule, path: Path, datamodule: Any = None) -> dict[str, Any]:
    trainer = Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, **QUIET)
    trainer.fit(model, datamodule=datamodule)
    trainer.save_checkpoint(path)
    return torch.load(path, weights_only=True)  # the file is readable by torch's safe loader as it is


def _built_with_warnings(factory: Any) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = factory()
    return built, [str(w.message) for w in caught if "save_hyperparameters" in str(w.message)]


def test_objects_are_reported_once_when_save_hyperparameters_is_called_not_at_the_first_checkpoint():
    model, messages = _built_with_warnings(lambda: WithObjects(
        nn.Linear(2, 2), nn.Tanh, torch.nn.init.ones_, functools.partial(torch.optim.Adam, lr=0.2), lr=0.2))
    assert len(messages) == 1
    for key in ("'backbone'", "'activation'", "'init'", "'optimizer'"):
        assert key in messages[0]
    assert "'lr'" not in messages[0]
    assert "WithObjects.load_from_checkpoint(path, backbone=..., activation=..., init=..., optimizer=...)" \
        in messages[0]
    assert "save_hyperparameters(ignore=['backbone'])" in messages[0]  # Lightning's advice for an nn.Module


def test_a_class_or_function_that_is_the_init_default_needs_no_warning():
    model, messages = _built_with_warnings(lambda: WithObjects(nn.Linear(2, 2)))
    assert len(messages) == 1 and "'backbone'" in messages[0]
    assert "'activation'" not in messages[0] and "'optimizer'" not in messages[0]


def test_numpy_scalars_are_stored_as_the_same_python_numbers(tmp_path: Path):
    np = pytest.importorskip("numpy")
    model, messages = _built_with_warnings(lambda: Plain(np.int64(8), ("a", np.float32(1.5)), np.float64(0.5)))
    assert messages == [] and type(model.hparams.scale) is np.float64  # live values stay as given
    saved = _fit_and_save(model, tmp_path / "m.ckpt")
    assert saved["hparams"]["width"] == 8 and type(saved["hparams"]["scale"]) is float
    assert saved["hparams"]["tags"] == ("a", 1.5) and "hparams_replaced" not in saved
    assert Plain.load_from_checkpoint(tmp_path / "m.ckpt").hparams.scale == 0.5


def test_plain_values_are_kept_without_a_warning():
    model, messages = _built_with_warnings(lambda: Plain(8, ("x", "y")))
    assert messages == []
    assert model.hparams == {"width": 8, "tags": ("x", "y"), "scale": 1.0}


def test_hparams_return_the_live_objects_as_in_lightning():
    backbone = nn.Linear(2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = WithObjects(backbone)
    assert model.hparams.backbone is backbone  # Lightning 2.6.6: `self.hparams.backbone is backbone` too
    assert model.hparams.activation is nn.ReLU


def test_the_checkpoint_stores_import_paths_and_reprs_and_pickles_no_object(tmp_path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        saved = _fit_and_save(WithObjects(nn.Linear(2, 2)), tmp_path / "m.ckpt")
    assert saved["hparams"] == {
        "backbone": "Linear(in_features=2, out_features=2, bias=True)",
        "activation": "torch.nn.modules.activation.ReLU",
        "init": "torch.nn.init.zeros_",
        "optimizer": {"_target_": "torch.optim.sgd.SGD", "_partial_": True, "lr": 0.1},
        "lr": 0.1,
    }
    assert sorted(saved["hparams_replaced"]) == ["activation", "backbone", "init", "optimizer"]


def test_a_lambda_and_an_object_without_import_path_are_stored_as_their_repr(tmp_path: Path):
    class Holder(BoringModel):
        def __init__(self, fn: Any, thing: Any) -> None:
            super().__init__()
            self.save_hyperparameters()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        saved = _fit_and_save(Holder(lambda x: x, argparse.Namespace(a=object())), tmp_path / "m.ckpt")
    assert saved["hparams"]["fn"].startswith("<function test_a_lambda")
    assert saved["hparams"]["thing"]["a"].startswith("<object object at")


def test_load_from_checkpoint_asks_for_the_values_stored_by_name_only(tmp_path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fit_and_save(WithObjects(nn.Linear(2, 2)), tmp_path / "m.ckpt")
        with pytest.raises(CheckpointLoadError, match=r"'backbone' \(a torch.nn.modules.linear.Linear instance.*"
                                                      r"load_from_checkpoint\(path, backbone=\.\.\.\)") as info:
            WithObjects.load_from_checkpoint(tmp_path / "m.ckpt")
        # activation, init and optimizer were the __init__ defaults, stored under the same name: not asked for
        assert "activation" not in str(info.value) and "optimizer" not in str(info.value)
        loaded = WithObjects.load_from_checkpoint(tmp_path / "m.ckpt", backbone=nn.Linear(2, 2))
    assert loaded.hparams.activation is nn.ReLU and loaded.hparams.lr == 0.1


def test_a_replaced_value_that_is_not_the_default_must_be_passed_again(tmp_path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fit_and_save(WithObjects(nn.Linear(2, 2), activation=nn.Tanh), tmp_path / "m.ckpt")
        with pytest.raises(CheckpointLoadError, match=r"'activation' \(a class, stored as its import path\)"):
            WithObjects.load_from_checkpoint(tmp_path / "m.ckpt", backbone=nn.Linear(2, 2))
        loaded = WithObjects.load_from_checkpoint(tmp_path / "m.ckpt", backbone=nn.Linear(2, 2), activation=nn.Tanh)
    assert loaded.hparams.activation is nn.Tanh


def test_ignore_leaves_the_argument_out_and_silences_the_warning(tmp_path: Path):
    class Ignoring(BoringModel):
        def __init__(self, backbone: nn.Module, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters(ignore=["backbone"])
            self.backbone = backbone

    model, messages = _built_with_warnings(lambda: Ignoring(nn.Linear(2, 2)))
    assert messages == [] and model.hparams == {"lr": 0.1}
    saved = _fit_and_save(model, tmp_path / "m.ckpt")
    assert saved["hparams"] == {"lr": 0.1} and "hparams_replaced" not in saved


def test_the_arguments_of_a_given_frame_are_recorded():
    import inspect

    class Built(TrainModule):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__()

        @classmethod
        def build(cls, depth: int = 2, width: int = 8) -> Built:
            model = cls()
            model.save_hyperparameters(frame=inspect.currentframe())
            return model

    assert Built.build(depth=3).hparams == {"depth": 3, "width": 8}


def test_a_base_class_recording_gets_the_subclass_arguments_as_in_lightning(tmp_path: Path):
    class Base(BoringModel):
        def __init__(self, lr: float = 1.0, depth: int = 1) -> None:
            super().__init__()
            self.save_hyperparameters()

    class Child(Base):
        def __init__(self, lr: float = 0.1, width: int = 3) -> None:
            super().__init__(lr=lr * 2, depth=5)

    assert Child().hparams == {"lr": 0.1, "depth": 5, "width": 3}  # Lightning 2.6.6 records the same
    _fit_and_save(Child(lr=0.3), tmp_path / "m.ckpt")
    # as in Lightning, the saved `depth` (Base's argument, not Child's) is not passed to Child
    assert Child.load_from_checkpoint(tmp_path / "m.ckpt").hparams == {"lr": 0.3, "depth": 5, "width": 3}


def test_ignore_removes_what_a_base_class_recorded():
    class Base(TrainModule):
        def __init__(self, secret: str = "s", lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()

    class Child(Base):
        def __init__(self, secret: str = "s", lr: float = 0.1) -> None:
            super().__init__(secret, lr)
            self.save_hyperparameters(ignore="secret")

    assert Child().hparams == {"lr": 0.1}


def test_a_dict_or_namespace_argument_becomes_the_hparams():
    class FromConfig(TrainModule):
        def __init__(self, config: Any) -> None:
            super().__init__()
            self.save_hyperparameters(config)

    assert FromConfig(argparse.Namespace(lr=0.1, depth=2)).hparams == {"lr": 0.1, "depth": 2}
    assert FromConfig({"lr": 0.2}).hparams.lr == 0.2


class FromConfig(BoringModel):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.save_hyperparameters(config)


def test_a_module_given_one_config_is_rebuilt_with_it_as_that_argument(tmp_path: Path):
    saved = _fit_and_save(FromConfig(argparse.Namespace(lr=0.1, depth=2)), tmp_path / "m.ckpt")
    assert saved["hparams"] == {"lr": 0.1, "depth": 2} and saved["hparams_name"] == "config"  # Lightning's keys
    assert FromConfig.load_from_checkpoint(tmp_path / "m.ckpt").hparams == {"lr": 0.1, "depth": 2}
    (tmp_path / "h.yaml").write_text("depth: 3\n")
    assert FromConfig.load_from_checkpoint(tmp_path / "m.ckpt", hparams_file=tmp_path / "h.yaml").hparams.depth == 3


def test_a_config_holding_objects_must_be_passed_again_as_a_whole(tmp_path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fit_and_save(FromConfig({"lr": 0.1, "act": nn.Tanh()}), tmp_path / "m.ckpt")
        with pytest.raises(CheckpointLoadError, match=r"'config' \(a config holding values stored by name only "
                                                      r"\('act'.*load_from_checkpoint\(path, config=\.\.\.\)"):
            FromConfig.load_from_checkpoint(tmp_path / "m.ckpt")
        loaded = FromConfig.load_from_checkpoint(tmp_path / "m.ckpt", config={"lr": 0.2, "act": nn.ReLU()})
    assert loaded.hparams.lr == 0.2


def test_hparams_initial_is_a_copy_of_what_was_recorded():
    model = Plain(8)
    model.hparams.width = 16
    assert model.hparams_initial == {"width": 8, "tags": ("a",), "scale": 1.0}
    model.hparams_initial["width"] = 32  # a copy: changing it changes nothing
    assert model.hparams_initial.width == 8 and model.hparams.width == 16


def test_the_checkpoint_holds_the_hparams_as_they_are_when_it_is_saved(tmp_path: Path):
    model = Plain(8)
    model.hparams.width = 16  # Lightning saves the current hparams, not the initial ones
    assert _fit_and_save(model, tmp_path / "m.ckpt")["hparams"]["width"] == 16


def test_logger_false_keeps_the_hparams_from_the_loggers(tmp_path: Path):
    from tests.trainer.test_logging import MemoryLogger

    class Unlogged(BoringModel):
        def __init__(self, width: int = 4) -> None:
            super().__init__()
            self.save_hyperparameters(logger=False)

    logger = MemoryLogger()
    model = Unlogged()
    Trainer(max_epochs=1, limit_train_batches=1, **{**QUIET, "logger": logger}).fit(model)
    assert logger.hparams == {} and model.hparams == {"width": 4}


class Data(DataModule):
    def __init__(self, batch_size: int = 4, name: str = "random") -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 16), batch_size=self.hparams.batch_size)


def test_datamodule_save_hyperparameters_fills_hparams_and_the_checkpoint(tmp_path: Path):
    data = Data(batch_size=8)
    assert data.hparams == {"batch_size": 8, "name": "random"} and data.hparams.batch_size == 8
    assert data.hparams_initial == {"batch_size": 8, "name": "random"}
    saved = _fit_and_save(BoringModel(), tmp_path / "m.ckpt", datamodule=data)
    assert saved["datamodule_hyper_parameters"] == {"batch_size": 8, "name": "random"}  # Lightning's key


def test_a_datamodule_argument_stored_by_repr_is_reported_without_the_module_advice():
    class Holding(DataModule):
        def __init__(self, transform: Any = None) -> None:
            super().__init__()
            self.save_hyperparameters()

    _, messages = _built_with_warnings(lambda: Holding(transform=lambda x: x))
    assert len(messages) == 1 and "Holding.load_from_checkpoint(path, transform=...)" in messages[0]
    assert "nn.Module" not in messages[0]


def test_datamodule_load_from_checkpoint_rebuilds_it_from_its_saved_hyperparameters(tmp_path: Path):
    _fit_and_save(BoringModel(), tmp_path / "m.ckpt", datamodule=Data(batch_size=8, name="saved"))
    assert Data.load_from_checkpoint(tmp_path / "m.ckpt").hparams == {"batch_size": 8, "name": "saved"}
    assert Data.load_from_checkpoint(tmp_path / "m.ckpt", batch_size=2).hparams.batch_size == 2


def test_a_datamodule_given_one_config_is_rebuilt_with_it(tmp_path: Path):
    class ConfigData(Data):
        def __init__(self, config: dict) -> None:
            DataModule.__init__(self)
            self.save_hyperparameters(config)

    saved = _fit_and_save(BoringModel(), tmp_path / "m.ckpt", datamodule=ConfigData({"batch_size": 8}))
    assert saved["datamodule_hparams_name"] == "config"
    assert ConfigData.load_from_checkpoint(tmp_path / "m.ckpt").hparams == {"batch_size": 8}


def test_load_from_checkpoint_takes_an_hparams_file_over_the_saved_values(tmp_path: Path):
    _fit_and_save(Plain(8), tmp_path / "m.ckpt")
    (tmp_path / "hparams.yaml").write_text("width: 6\nscale: 2.5\n")
    (tmp_path / "hparams.csv").write_text("key,value\nwidth,5\n")
    assert Plain.load_from_checkpoint(tmp_path / "m.ckpt", hparams_file=tmp_path / "hparams.yaml").hparams == {
        "width": 6, "tags": ("a",), "scale": 2.5}
    assert Plain.load_from_checkpoint(tmp_path / "m.ckpt", None, tmp_path / "hparams.csv", width=7).hparams.width == 7
    assert Plain.load_from_checkpoint(tmp_path / "m.ckpt", hparams_file=tmp_path / "hparams.csv").hparams.width == 5


def test_the_loggers_get_hparams_initial_as_in_lightning():
    from tests.trainer.test_logging import MemoryLogger

    model = Plain(8)
    model.hparams.width = 16  # after save_hyperparameters: Lightning logs what was recorded
    logger = MemoryLogger()
    Trainer(max_epochs=1, limit_train_batches=1, **{**QUIET, "logger": logger}).fit(model)
    assert logger.hparams["width"] == 8


def test_a_key_of_module_and_datamodule_with_different_values_is_an_error():
    from tests.trainer.test_logging import MemoryLogger

    class Named(BoringModel):
        def __init__(self, name: str = "model") -> None:
            super().__init__()
            self.save_hyperparameters()

    trainer = Trainer(max_epochs=1, limit_train_batches=1, **{**QUIET, "logger": MemoryLogger()})
    with pytest.raises(MisconfigurationError, match=r"\['name'\] are in both the module's and the DataModule's"):
        trainer.fit(Named(), datamodule=Data(name="data"))
    trainer = Trainer(max_epochs=1, limit_train_batches=1, **{**QUIET, "logger": MemoryLogger()})
    trainer.fit(Named(name="same"), datamodule=Data(name="same"))  # equal values merge, as in Lightning


def test_datamodule_hparams_reach_the_loggers():
    from tests.trainer.test_logging import MemoryLogger

    logger = MemoryLogger()
    Trainer(max_epochs=1, limit_train_batches=1, **{**QUIET, "logger": logger}).fit(BoringModel(),
                                                                                      datamodule=Data(batch_size=8))
    assert logger.hparams == {"batch_size": 8, "name": "random"}


def test_what_we_record_matches_lightning_2_6_6():
    pl = pytest.importorskip("lightning.pytorch", reason="Lightning is the oracle here; the other tests need none")

    def build(base: type) -> Any:
        class Side(base):  # type: ignore[misc, valid-type]
            def __init__(self, backbone: nn.Module, activation: type = nn.ReLU, lr: float = 0.1,
                         name: str = "x") -> None:
                super().__init__()
                self.save_hyperparameters(ignore="name")

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return Side(backbone, nn.Tanh, 0.3)

    backbone = nn.Linear(2, 2)
    ours, theirs = build(TrainModule), build(pl.LightningModule)
    assert dict(ours.hparams) == dict(theirs.hparams)
    assert (ours.hparams.backbone is backbone) == (theirs.hparams.backbone is backbone)
    assert dict(ours.hparams_initial).keys() == dict(theirs.hparams_initial).keys()


def test_the_rows_of_this_area_in_from_lightning_name_tests_that_exist():
    """docs/from-lightning.md, "Hyperparameters and checkpoints": every test a row names is defined, so the table
    cannot drift from the tests."""
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "from-lightning.md").read_text()
    section = text.split("### Hyperparameters and checkpoints", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith(("| ---",
                                                                                                     "| Lightning"))]
    assert len(rows) >= 13 and all("tests/" in row for row in rows)
    missing = []
    for row in rows:
        current = None
        for ref in re.findall(r"`((?:tests/[\w/]+\.py)?::\w+)`", row):
            file, name = ref.split("::")
            current = file or current
            assert current, f"a row names {ref!r} before any file: {row[:60]}"
            if not re.search(rf"^def {name}\(", (root / current).read_text(), re.M):
                missing.append(f"{current}::{name}")
    assert missing == []
